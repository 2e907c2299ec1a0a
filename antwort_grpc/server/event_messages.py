"""The messages a stream of events leaves in: one event each, or (batch_events) the events that
were produced together, in the stream message's `events` field. The same for a run's own events
and for events read back from a background response's log."""

from __future__ import annotations

from collections.abc import Sequence

from antwort_grpc import pb
from antwort_grpc.front.batching import BATCH_BYTES, parted
from antwort_grpc.server.decode import EventBatch, EventMessage

Message = EventMessage | EventBatch

# The `events` field of each stream's message.
CREATE_EVENTS: int = pb.CreateResponseResponse.DESCRIPTOR.fields_by_name["events"].number
CONVERSE_EVENTS: int = pb.ConverseResponse.DESCRIPTOR.fields_by_name["events"].number
ATTACH_EVENTS: int = pb.AttachResponseResponse.DESCRIPTOR.fields_by_name["events"].number

# Stands in for the event of a message written from its bytes (EventMessage writes `wire`).
FROM_WIRE = pb.StreamEvent()


def wire_messages(wires: Sequence[bytes], field: int) -> list[Message]:
    """Serialized events in as few messages as BATCH_BYTES allows; one alone goes in `event`."""
    if len(wires) > 1 and sum(map(len, wires)) <= BATCH_BYTES:
        return [EventBatch(wires, field)]
    return [
        EventBatch(part, field) if len(part) > 1 else EventMessage(FROM_WIRE, part[0])
        for part in parted(wires, BATCH_BYTES)
    ]
