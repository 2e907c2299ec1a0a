"""A Converse session: responses one after another on one stream, controls for the one running,
or one response attached to (its log read, its controls sent wherever it runs).

A reader task takes the client's messages; the session's task writes. The client's messages that
cannot be accepted are answered in-band (`ConverseSink.rejected`), except a bad first message,
which ends the session with its error: nothing runs yet that it could harm."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias

import grpc

from antwort_grpc import pb
from antwort_grpc.edge import Reservation, Watch
from antwort_grpc.engine.run import Run
from antwort_grpc.errors import FieldViolation, RequestError, invalid_argument
from antwort_grpc.event_kinds import is_terminal
from antwort_grpc.front.batching import batches
from antwort_grpc.front.call import Call, Encoded, Sink
from antwort_grpc.front.creates import follow
from antwort_grpc.front.stalls import Guard
from antwort_grpc.responses.controls import check_control

if TYPE_CHECKING:
    from antwort_grpc.front import Front

# A create the reader hands over: the request, its size on the wire, the room reserved for it.
Create: TypeAlias = tuple[pb.CreateResponseRequest, int, Reservation | None]
Next: TypeAlias = Create | RequestError | pb.AttachResponseRequest | None


class ConverseSink(Sink, Protocol):
    async def rejected(self, error: RequestError) -> None:
        """A message of the client's that could not be accepted, answered in-band."""
        ...


class Session:
    def __init__(
        self,
        front: Front,
        call: Call,
        requests: AsyncIterator[Encoded[pb.ConverseRequest]],
        sink: ConverseSink,
        watch: Watch,
        guard: Guard,
    ) -> None:
        self.front = front
        # Marks the session's writes: a client that stops reading is cut (stalls.py).
        self.guard = guard
        self.responses = front.responses
        self.edge = front.edge
        self.call = call
        self.requests = requests
        self.sink = sink
        self.watch = watch
        self.owner = call.owner
        self.caller = call.caller()
        loop = asyncio.get_running_loop()
        self.deadline = None if call.timeout is None else loop.time() + call.timeout
        # What the reader hands over: the next response to start, the error that ends the session
        # (a bad first message), or None once the client has stopped sending.
        self.creates: asyncio.Queue[Next] = asyncio.Queue()
        self.run: Run | None = None
        # The response the session follows after an attach (its controls go there).
        self.attached: str | None = None
        # Controls that came while the response was being started: delivered once it runs.
        self.early: list[pb.Control] | None = None
        # One write at a time: events from this task, rejections from the reader.
        self.writing = asyncio.Lock()

    def _remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - asyncio.get_running_loop().time()

    async def serve(self, idle_timeout: float = 0.0) -> None:
        """Responses one after another until the client stops sending, or until it has let
        `idle_timeout` seconds pass with none running (0: it may wait for ever)."""
        reader = asyncio.create_task(self._read())
        try:
            first = True
            while (next_create := await self._next(idle_timeout)) is not None:
                if isinstance(next_create, RequestError):
                    raise next_create  # counted by the session's watch as it ends the session
                if isinstance(next_create, pb.AttachResponseRequest):
                    await self._attach(next_create)
                    first = False
                    continue
                await self._create(next_create, reader, first)
                first = False
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            # A create read but never started holds its reservation: given back.
            while not self.creates.empty():
                left = self.creates.get_nowait()
                if isinstance(left, tuple) and left[2] is not None:
                    left[2].release()

    async def _create(self, create: Create, reader: asyncio.Task[None], first: bool) -> None:
        request, size, reserved = create
        request.stream = True  # a session always streams its events
        try:
            if request.background:
                if reserved is not None:
                    reserved.release()
                raise invalid_argument([_NOT_HERE])
            # Each response of the session is admitted apart, for as long as it runs.
            with self.edge.response(size, reserved) as admitted:
                run = await self.responses.create(
                    request, owner=self.owner, timeout=self._remaining(), controller=True, caller=self.caller
                )
                await self._stream(run, reader, admitted, request.batch_events)
        except RequestError as err:
            self.early = None
            if first:
                raise  # counted by the session's watch, as it ends the session
            self.watch.refused(err)
            await self._reject(err)

    async def _attach(self, request: pb.AttachResponseRequest) -> None:
        """Follow a response already running (its log), as a create's events would be."""
        try:
            durable = self.front.durability()
            await durable.attach_check(request.response_id, self.owner, request.starting_after)
        except RequestError:
            self.attached = None
            raise  # counted by the session's watch, as it ends the session
        try:
            sink = _Locked(self)
            await follow(
                durable,
                request.response_id,
                self.owner,
                request.starting_after,
                None,
                sink,
                self.guard,
                request.batch_events,
            )
        finally:
            self.attached = None

    async def _next(self, idle_timeout: float) -> Next:
        """What the reader hands over next; an idle_timeout error when nothing comes in time."""
        if not idle_timeout:
            return await self.creates.get()
        try:
            async with asyncio.timeout(idle_timeout):
                return await self.creates.get()
        except TimeoutError:
            idle = RequestError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no response ran on this stream for {idle_timeout:g} s (ANTWORT_CONVERSE_IDLE_TIMEOUT): "
                "open a new stream, and continue with previous_response_id",
                reason="idle_timeout",
            )
            return idle

    async def _stream(self, run: Run, reader: asyncio.Task[None], admitted: Reservation, batched: bool) -> None:
        self.run = run
        early, self.early = self.early or [], None
        for control in early:
            await self._control(control)
        if reader.done():
            run.detach()
        try:
            async with contextlib.aclosing(run.events()) as events:
                if batched:
                    async with contextlib.aclosing(batches(events, lambda: run.ended, is_terminal)) as steps:
                        async for batch in steps:
                            await self._write(run, batch, admitted)
                    return
                async for event in events:
                    await self._write(run, [event], admitted)
        finally:
            self.run = None

    async def _write(self, run: Run, batch: list[pb.StreamEvent], admitted: Reservation) -> None:
        for event in batch:
            self.watch.saw(event)
        if is_terminal(batch[-1]):
            # The client may send its next create the moment it reads the terminal event, while
            # the run still winds down: the session takes it from now, and the room the response
            # was admitted in is given back, so that create is admitted as it comes.
            self.run = None
            admitted.release()
        guard = self.guard
        async with self.writing:
            guard.writing = True
            if len(batch) == 1:
                await self.sink.event(batch[0], run.take_wire(batch[0]))
            else:
                take = run.take_wire
                await self.sink.batch(batch, [take(event) or event.SerializeToString() for event in batch])
            guard.writing = False
            guard.sent += 1

    async def _read(self) -> None:
        try:
            first = True
            async for encoded in self.requests:
                message = await self._admitted(encoded, first)
                if message is None:
                    continue
                if isinstance(message, RequestError):
                    self.creates.put_nowait(message)  # a bad first message ends the session
                    return
                request, reserved = message
                taken = await self._take(request, reserved, encoded.size, first)
                if taken is None:
                    return
                first = taken
        finally:
            # No more controls: nobody is left to decide approvals; no further responses.
            if self.run is not None:
                self.run.detach()
            self.creates.put_nowait(None)

    async def _admitted(
        self, encoded: Encoded[pb.ConverseRequest], first: bool
    ) -> tuple[pb.ConverseRequest, Reservation | None] | RequestError | None:
        """A message decoded, a create admitted first. A create refused admission is answered
        in-band (None), or returned to end the session when it is the first message; a message
        that does not decode is returned: it ends the session."""
        if not encoded.starts_response:
            try:
                return await encoded.decode(), None
            except RequestError as err:
                return err  # counted by the session's watch, as it ends the session
        try:
            reserved = self.front.admit(self.call, encoded, counted=not first)
        except RequestError as err:
            if first:
                return err
            await self._reject(err)
            return None
        try:
            return await self.front.decoded(self.call, encoded, reserved, counted=False), reserved
        except RequestError as err:
            return err

    async def _take(
        self, message: pb.ConverseRequest, reserved: Reservation | None, size: int, first: bool
    ) -> bool | None:
        """One decoded message taken; whether the next is still the first (None: the reading ends)."""
        which = message.WhichOneof("message")
        if which != "create" and reserved is not None:
            reserved.release()  # a create field, followed by another of the oneof
        if first and which == "attach":
            self.attached = message.attach.response_id
            self.creates.put_nowait(message.attach)
            return False
        if which == "attach":
            await self._reject(
                invalid_argument([FieldViolation("attach", "only the first message of a session attaches")])
            )
            return first
        if first and which != "create":
            violation = FieldViolation("create", "the first message of a session starts a response")
            self.creates.put_nowait(invalid_argument([violation]))
            return None
        if which == "create":
            if self.run is not None or self.early is not None or self.attached is not None:
                if reserved is not None:
                    reserved.release()
                await self._reject(_busy())
                return False
            self.early = []
            self.creates.put_nowait((message.create, size, reserved))
        elif which == "control":
            await self._control(message.control)
        else:
            await self._reject(invalid_argument([FieldViolation("message", "required: create or control")]))
        return False

    async def _control(self, control: pb.Control) -> None:
        try:
            check_control(control, self.responses.limits.max_control_items)
            if self.run is None and self.early is not None:
                self.early.append(control)
                return
            if self.run is None and self.attached is not None:
                # Wherever the attached response runs (this replica or another).
                await self.responses.control(self.attached, control, self.owner)
                return
            if self.run is None:
                raise RequestError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "no response is running on this stream",
                    [FieldViolation("control", "no response is running on this stream")],
                    "not_in_progress",
                )
            self.run.send(control)
        except RequestError as err:
            await self._reject(err)

    async def _reject(self, err: RequestError) -> None:
        async with self.writing:
            await self.sink.rejected(err)


class _Locked:
    """The session's sink for a log's pages: one write at a time with the reader's rejections."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.takes_wire = session.sink.takes_wire

    async def event(self, event: pb.StreamEvent, wire: bytes | None) -> None:
        async with self.session.writing:
            await self.session.sink.event(event, wire)

    async def batch(self, events: Sequence[pb.StreamEvent], wires: Sequence[bytes]) -> None:
        async with self.session.writing:
            await self.session.sink.batch(events, wires)

    async def logged(self, wires: Sequence[bytes], batched: bool) -> None:
        async with self.session.writing:
            await self.session.sink.logged(wires, batched)


# A session's responses belong to it: a background one starts with CreateResponse, and a session
# attaches to it.
_NOT_HERE = FieldViolation(
    "create.background", "a session runs its own responses: start a background one with CreateResponse, then attach"
)


def _busy() -> RequestError:
    return RequestError(
        grpc.StatusCode.FAILED_PRECONDITION,
        "a response is still running on this stream: send the next create after its terminal event",
        [FieldViolation("create", "a response is still running on this stream")],
        "response_in_progress",
    )
