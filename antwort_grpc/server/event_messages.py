"""The messages a stream of events leaves in: one event each, or (batch_events) the events that
were produced together, in the stream message's `events` field. The same for a run's own events
and for events read back from a background response's log."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

from antwort_grpc import pb
from antwort_grpc.edge import Watch
from antwort_grpc.engine.run import Run
from antwort_grpc.server.batching import BATCH_BYTES, batches, parted
from antwort_grpc.server.decode import EventBatch, EventMessage

Message = EventMessage | EventBatch

TERMINAL = frozenset({"completed", "incomplete", "failed", "cancelled", "requires_action"})

# The `events` field of each stream's message.
CREATE_EVENTS: int = pb.CreateResponseResponse.DESCRIPTOR.fields_by_name["events"].number
CONVERSE_EVENTS: int = pb.ConverseResponse.DESCRIPTOR.fields_by_name["events"].number
ATTACH_EVENTS: int = pb.AttachResponseResponse.DESCRIPTOR.fields_by_name["events"].number

# Stands in for the event of a message written from its bytes (EventMessage writes `wire`).
FROM_WIRE = pb.StreamEvent()


def is_terminal(event: pb.StreamEvent) -> bool:
    return event.WhichOneof("event") in TERMINAL


def one_message(event: pb.StreamEvent, run: Run) -> EventMessage:
    # A lifecycle event is written as the engine serialized it (its Response once, not again).
    return EventMessage(event, run.take_wire(event))


async def batched_messages(
    events: AsyncGenerator[pb.StreamEvent, None], run: Run, field: int, watch: Watch
) -> AsyncGenerator[Message, None]:
    """The events of `run` in messages of those produced at the same moment (batch_events).
    Close it before `events`: until then it may hold a step of them."""
    observing = watch.observing
    async with contextlib.aclosing(batches(events, lambda: run.ended, is_terminal)) as batched:
        async for batch in batched:
            if observing:
                for event in batch:
                    watch.saw(event)
            for message in batch_messages(batch, run, field):
                yield message


def batch_messages(batch: list[pb.StreamEvent], run: Run, field: int) -> list[Message]:
    """A batch in as few messages as BATCH_BYTES allows (one, unless its events are large)."""
    if len(batch) == 1:
        return [one_message(batch[0], run)]
    return wire_messages([run.take_wire(event) or event.SerializeToString() for event in batch], field)


def wire_messages(wires: list[bytes], field: int) -> list[Message]:
    """Serialized events in as few messages as BATCH_BYTES allows; one alone goes in `event`."""
    if len(wires) > 1 and sum(map(len, wires)) <= BATCH_BYTES:
        return [EventBatch(wires, field)]
    return [
        EventBatch(part, field) if len(part) > 1 else EventMessage(FROM_WIRE, part[0])
        for part in parted(wires, BATCH_BYTES)
    ]


async def logged_messages(
    pages: AsyncGenerator[list[tuple[int, bytes]], None], field: int | None, watch: Watch | None
) -> AsyncGenerator[Message, None]:
    """Events read from a log, page by page: one message each, or with `field` (batch_events)
    each page's events together. `watch` sees each event (None: not observed here). Closing it
    closes `pages` (the reader's watch of the log)."""
    observing = watch is not None and watch.observing
    async with contextlib.aclosing(pages):
        async for page in pages:
            wires = [data for _seq, data in page]
            if observing:
                assert watch is not None
                for data in wires:
                    watch.saw(pb.StreamEvent.FromString(data))
            if field is None:
                for data in wires:
                    yield EventMessage(FROM_WIRE, data)
            else:
                for message in wire_messages(wires, field):
                    yield message
