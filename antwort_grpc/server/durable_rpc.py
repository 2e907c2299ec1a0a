"""The gRPC side of durable creates (responses/durable.py): a background or idempotent
CreateResponse, and AttachResponse. Events read from the log go out as the bytes the log holds."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import Any

from antwort_grpc import pb
from antwort_grpc.edge import Reservation, Watch
from antwort_grpc.engine.run import Run
from antwort_grpc.hooks.service import Caller
from antwort_grpc.responses.background import Runner
from antwort_grpc.responses.durable import IDEMPOTENCY_KEY, Durability
from antwort_grpc.server.decode import EventMessage
from antwort_grpc.server.event_messages import CREATE_EVENTS, Message, batched_messages, logged_messages


class Admitted:
    """The admission room of a durable create, and its slot of the principal's limit (held by
    `watch`): given back when the call ends, or, for a background run, when the run does (it
    goes on running here after the call)."""

    def __init__(self, reservation: Reservation, watch: Watch | None = None) -> None:
        self.reservation = reservation
        self.watch = watch
        self.kept = False

    def keep_until(self, runner: Runner) -> None:
        """Both are the run's now, given back when it no longer runs here."""
        self.kept = True
        runner.hold(self.reservation.release)
        slot = self.watch.keep_slot() if self.watch is not None else None
        if slot is not None:
            runner.hold(slot)

    def done(self) -> None:
        if not self.kept:
            self.reservation.release()


def wants_durable(request: pb.CreateResponseRequest, metadata: Any) -> bool:
    """Whether a create goes the durable way: background, or an idempotency key (a loop, not
    any() over a generator: this is on every create's path)."""
    if request.background:
        return True
    for entry in metadata:  # noqa: SIM110
        if entry[0] == IDEMPOTENCY_KEY:
            return True
    return False


async def durable_create(
    durable: Durability,
    request: pb.CreateResponseRequest,
    *,
    owner: str,
    key: str | None,
    timeout: float | None,
    caller: Caller | None,
    watch: Watch,
    admitted: Admitted | None = None,
) -> AsyncGenerator[Message, None]:
    begun = await durable.begin(request, owner=owner, key=key, timeout=timeout, caller=caller)
    if begun.runner is not None and admitted is not None:
        admitted.keep_until(begun.runner)
    if begun.run is not None and begun.runner is None:
        # An idempotent create that is not background: the connection owns it, as any create.
        async for message in owned(begun.run, request, watch):
            yield message
        return
    if begun.runner is not None and not request.stream:
        event, wire = await begun.runner.first
        watch.saw(event)
        yield EventMessage(event, wire)
        return
    if request.stream and begun.logged:
        field = CREATE_EVENTS if request.batch_events else None
        async for message in attached(durable, begun.response_id, owner, 0, watch, field):
            yield message
        return
    # A retried non-streaming create, or one that is not background: the response as stored (it
    # ended, for one that is not background: its retry waits for that).
    event = await durable.stored_answer(begun, owner)
    watch.saw(event)
    yield EventMessage(event)


async def owned(run: Run, request: pb.CreateResponseRequest, watch: Watch) -> AsyncGenerator[Message, None]:
    events = run.events()
    stream = request.stream
    try:
        if stream and request.batch_events:
            batched = batched_messages(events, run, CREATE_EVENTS, watch)
            async with contextlib.aclosing(batched):
                async for message in batched:
                    yield message
            return
        last = None
        async for event in events:
            watch.saw(event)
            if stream:
                yield EventMessage(event, run.take_wire(event))
            last = event
        if not stream and last is not None:
            yield EventMessage(last, run.take_wire(last))
    finally:
        await events.aclose()


async def attached(
    durable: Durability, response_id: str, owner: str, starting_after: int, watch: Watch, field: int | None = None
) -> AsyncGenerator[Message, None]:
    """The log's events after `starting_after`, to the terminal one (checked first). With
    `field` (batch_events), the events read together leave together, in that field."""
    await durable.attach_check(response_id, owner, starting_after)
    messages = logged_messages(durable.follow_pages(response_id, owner, starting_after), field, watch)
    async with contextlib.aclosing(messages):
        async for message in messages:
            yield message
