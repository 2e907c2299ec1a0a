"""The gRPC door's sinks: the core's events written as stream messages (event_messages.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any

from antwort_grpc import pb
from antwort_grpc.errors import RequestError
from antwort_grpc.front import rejection
from antwort_grpc.server.decode import EventMessage
from antwort_grpc.server.event_messages import FROM_WIRE, wire_messages


class StreamWriter:
    """A server stream's messages: one event each, or events together in the message's `events`
    (field number `field`)."""

    __slots__ = ("context", "field")

    takes_wire = True  # the engine's bytes of an event are sent as they are

    def __init__(self, context: Any, field: int) -> None:
        self.context = context
        self.field = field

    def event(self, event: pb.StreamEvent, wire: bytes | None) -> Awaitable[None]:
        # grpc's write itself, awaited by the caller: no coroutine of ours per streamed event.
        written: Awaitable[None] = self.context.write(EventMessage(event, wire))
        return written

    async def batch(self, events: Sequence[pb.StreamEvent], wires: Sequence[bytes]) -> None:
        for message in wire_messages(wires, self.field):
            await self.context.write(message)

    async def logged(self, wires: Sequence[bytes], batched: bool) -> None:
        write = self.context.write
        if not batched:
            for data in wires:
                await write(EventMessage(FROM_WIRE, data))
            return
        for message in wire_messages(wires, self.field):
            await write(message)


class ConverseWriter(StreamWriter):
    """A Converse stream's messages, and its in-band rejections."""

    __slots__ = ()

    async def rejected(self, error: RequestError) -> None:
        await self.context.write(pb.ConverseResponse(rejected=rejection(error)))
