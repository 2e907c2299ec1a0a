"""How a response's events reach a door's sink: a run's own (every event, batched, or only the
last for a non-streaming answer) and a background response's, read from its log."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Collection, Sequence
from typing import Any

from antwort_grpc import pb
from antwort_grpc.durable.creates import IDEMPOTENCY_KEY, Durability
from antwort_grpc.edge import Watch
from antwort_grpc.engine.run import Run
from antwort_grpc.event_kinds import is_terminal, terminal_response
from antwort_grpc.front.batching import batches
from antwort_grpc.front.call import Sink
from antwort_grpc.front.stalls import Guard

Events = AsyncGenerator[pb.StreamEvent, None]


def wants_durable(background: bool, metadata: Collection[tuple[str, Any]]) -> bool:
    """Whether a create goes the durable way: background, or an idempotency key (a loop, not
    any() over a generator: this is on every create's path)."""
    if background:
        return True
    for entry in metadata:  # noqa: SIM110
        if entry[0] == IDEMPOTENCY_KEY:
            return True
    return False


async def deliver(run: Run, request: pb.CreateResponseRequest, watch: Watch, sink: Sink, guard: Guard) -> None:
    """Run `run` to its end, its events to `sink` as the request asks; `guard` marks each write
    (a client that stops reading is cut, stalls.py)."""
    # Closed with this call, however it ends (try/finally: aclosing's two calls, per request).
    events = run.events()
    try:
        if request.stream and request.batch_events:
            await _batched(run, events, watch, sink, guard)
        elif request.stream:
            observing = watch.observing
            wires = sink.takes_wire
            async for event in events:
                if observing:
                    watch.saw(event)
                guard.writing = True
                await sink.event(event, run.take_wire(event) if wires else None)
                guard.writing = False
                guard.sent += 1
        else:
            # One code path: drain the same stream, send only the terminal event.
            last = None
            observing = watch.observing
            async for event in events:
                if observing:
                    watch.saw(event)
                last = event
            assert last is not None
            guard.writing = True
            await sink.event(last, run.take_wire(last) if sink.takes_wire else None)
        watch.ended()
    finally:
        await events.aclose()


async def _batched(run: Run, events: Events, watch: Watch, sink: Sink, guard: Guard) -> None:
    observing = watch.observing
    batched = batches(events, lambda: run.ended, is_terminal)
    # Closed before `events` (by the caller): until then it may hold a step of them.
    try:
        async for batch in batched:
            if observing:
                for event in batch:
                    watch.saw(event)
            guard.writing = True
            if len(batch) == 1:
                await sink.event(batch[0], run.take_wire(batch[0]))
            else:
                take = run.take_wire
                await sink.batch(batch, [take(event) or event.SerializeToString() for event in batch])
            guard.writing = False
            guard.sent += 1
    finally:
        await batched.aclose()


class Last:
    """A sink that keeps the one event a non-streaming answer sends: the core reading a response
    itself (compaction)."""

    takes_wire = False

    def __init__(self) -> None:
        self.last: pb.StreamEvent | None = None

    async def event(self, event: pb.StreamEvent, wire: bytes | None) -> None:
        self.last = event

    async def batch(self, events: Sequence[pb.StreamEvent], wires: Sequence[bytes]) -> None:
        self.last = events[-1]

    async def logged(self, wires: Sequence[bytes], batched: bool) -> None:
        self.last = pb.StreamEvent.FromString(wires[-1])

    def response(self) -> pb.Response:
        assert self.last is not None, "the run sent no event"
        return terminal_response(self.last)


async def follow(
    durable: Durability,
    response_id: str,
    owner: str,
    starting_after: int,
    watch: Watch | None,
    sink: Sink,
    guard: Guard,
    batched: bool = False,
) -> None:
    """The log's events after `starting_after` (checked by the caller), page by page, to the
    terminal one. `watch` sees each (None: not observed here)."""
    observing = watch is not None and watch.observing
    pages = durable.follow_pages(response_id, owner, starting_after)
    try:
        async for page in pages:
            wires = [data for _seq, data in page]
            if observing:
                assert watch is not None
                for data in wires:
                    watch.saw(pb.StreamEvent.FromString(data))
            guard.writing = True
            await sink.logged(wires, batched)
            guard.writing = False
            guard.sent += 1
    finally:
        await pages.aclose()
