"""The HTTP side of durable creates: a background create (`"background": true`), a create with an
`Idempotency-Key` header, and streaming a background response again
(`GET /v1/responses/{id}?stream=true&starting_after=N`).

Everything durable is the responses layer's (responses/durable.py), as for the gRPC door
(server/durable_rpc.py, which this door cannot import: the server imports the door): `begin`
binds the key and starts the run, `attach_check` and `follow` read the event log. Here the log's
bytes become StreamEvents again (the door sends JSON), and the branches of what a begun create
answers are the gRPC door's, one for one.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from antwort_grpc import pb
from antwort_grpc.edge import Reservation, Watch
from antwort_grpc.responses.durable import IDEMPOTENCY_KEY, Begun, Durability, unavailable

Events = AsyncGenerator[pb.StreamEvent, None]


def wants_durable(background: bool, metadata: list[tuple[str, str]]) -> bool:
    """Whether a create goes the durable way: background, or an `Idempotency-Key` header."""
    return background or any(name == IDEMPOTENCY_KEY for name, _ in metadata)


def durability(responses: Any) -> Durability:
    durable: Durability | None = responses.durable
    if durable is None:
        raise unavailable()
    return durable


def keep_until_run_ends(reserved: Reservation, begun: Begun, watch: Watch) -> bool:
    """A background run keeps its admission room and its slot of the principal's limit until it
    ends (it goes on after the request); True when the run took them over."""
    runner = begun.runner
    if runner is None:
        return False
    runner.hold(reserved.release)
    slot = watch.keep_slot()
    if slot is not None:
        runner.hold(slot)
    return True


async def begun_events(durable: Durability, begun: Begun, stream: bool, owner: str) -> Events:
    """What a begun create answers with, as events (non-streaming: the last is the answer)."""
    if begun.run is not None and begun.runner is None:
        # An idempotent create that is not background: the request owns it, as any create.
        events = begun.run.events()
        try:
            async for event in events:
                yield event
        finally:
            await events.aclose()
        return
    if begun.runner is not None and not stream:
        event, _ = await begun.runner.first
        yield event
        return
    if stream and begun.logged:
        async for event in attached(durable, begun.response_id, owner, 0):
            yield event
        return
    # A retried create: the response as stored (one that is not background: once it ended).
    yield await durable.stored_answer(begun, owner)


async def attached(durable: Durability, response_id: str, owner: str, starting_after: int) -> Events:
    """The log's events after `starting_after`, to the terminal one: what AttachResponse reads.
    The caller checks first (`durable.attach_check`), before its response's headers go out."""
    async for _seq, data in durable.follow(response_id, owner, starting_after):
        yield pb.StreamEvent.FromString(data)
