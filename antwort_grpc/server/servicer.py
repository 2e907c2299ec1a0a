"""antwort.v1.ResponsesService: the gRPC front door of the responses layer. It only adapts:
messages in, RequestErrors out as statuses with details, events out as stream messages. Who calls,
whether their response may start and observing it are the neutral edge's (edge.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, TypeAlias

import grpc

from antwort_grpc import pb
from antwort_grpc.auth import current_identity, current_owner
from antwort_grpc.edge import Edge, Reservation, Watch
from antwort_grpc.engine.run import Run
from antwort_grpc.errors import FieldViolation, RequestError, invalid_argument
from antwort_grpc.grpc_status import abort
from antwort_grpc.hooks.service import Caller
from antwort_grpc.responses.controls import validate_control
from antwort_grpc.responses.durable import idempotency_key, unavailable
from antwort_grpc.responses.service import Responses, rejection
from antwort_grpc.server import durable_rpc
from antwort_grpc.server.batching import batches
from antwort_grpc.server.decode import EventBatch, EventMessage, request_bytes, reservation
from antwort_grpc.server.durable_rpc import wants_durable
from antwort_grpc.server.event_messages import (
    ATTACH_EVENTS,
    CONVERSE_EVENTS,
    CREATE_EVENTS,
    batch_messages,
    batched_messages,
    is_terminal,
    logged_messages,
    one_message,
)

# grpc ships no type information: the servicer context is untyped.
Context: TypeAlias = Any

# A create the reader hands over: the request, its size on the wire, the room reserved for it
# before it was parsed (None: none was).
Create: TypeAlias = tuple[pb.CreateResponseRequest, int, Reservation | None]


def owner_of(context: Context) -> str:
    """Whose responses the caller sees: set by the authentication interceptor ("" without it)."""
    return current_owner()


def caller_of(context: Context) -> Caller:
    """Who is calling and the trace they call in: passed on to hook services."""
    caller = Caller.from_metadata(context.invocation_metadata() or ())
    return dataclasses.replace(caller, owner=owner_of(context))


class ResponsesServicer(pb.ResponsesServiceServicer):
    def __init__(self, responses: Responses, edge: Edge | None = None, converse_idle_timeout: float = 0.0) -> None:
        self.responses = responses
        self.edge = edge or Edge()
        # Seconds a Converse stream may wait with no response running; 0: for ever.
        self.converse_idle_timeout = converse_idle_timeout

    async def CreateResponse(
        self, request: pb.CreateResponseRequest, context: Context
    ) -> AsyncIterator[EventMessage | EventBatch]:  # a CreateResponseResponse on the wire
        metadata = context.invocation_metadata() or ()
        if wants_durable(request, metadata):
            async for logged in self._durable_create(request, context, metadata):
                yield logged
            return
        try:
            async with self.edge.stream("CreateResponse", current_identity.get(), metadata) as watch:
                # Admitted before its request was parsed (the reservation taken over), else now.
                with self.edge.response(request_bytes.get() or request.ByteSize(), reservation.get()):
                    caller = caller_of(context) if self.responses.hooked else None
                    run = await self.responses.create(
                        request, owner=owner_of(context), timeout=context.time_remaining(), caller=caller
                    )
                    # Closed with this call, however it ends (try/finally: aclosing's two calls, per request).
                    events = run.events()
                    observing = watch.observing
                    try:
                        if request.stream and request.batch_events:
                            # Closed before `events`: until then it may hold a step of it.
                            batched = batched_messages(events, run, CREATE_EVENTS, watch)
                            async with contextlib.aclosing(batched):
                                async for message in batched:
                                    yield message
                        elif request.stream:
                            async for event in events:
                                if observing:
                                    watch.saw(event)
                                yield one_message(event, run)
                        else:
                            # One code path: drain the same stream, send only the terminal event.
                            last = None
                            async for event in events:
                                if observing:
                                    watch.saw(event)
                                last = event
                            assert last is not None
                            yield one_message(last, run)
                        watch.ended()
                    finally:
                        await events.aclose()
        except RequestError as err:
            await abort(context, err)

    async def _durable_create(
        self, request: pb.CreateResponseRequest, context: Context, metadata: Any
    ) -> AsyncIterator[EventMessage | EventBatch]:
        """A background create, or one with an idempotency key (server/durable_rpc.py)."""
        try:
            async with self.edge.stream("CreateResponse", current_identity.get(), metadata) as watch:
                durable = self.responses.durable
                if durable is None:
                    raise unavailable()
                # Admitted as any create; a background run keeps its room, and its slot of the
                # principal's limit, until it ends.
                reserved = reservation.get()
                admitted = durable_rpc.Admitted(
                    reserved
                    if reserved is not None
                    else self.edge.admission.reserve(request_bytes.get() or request.ByteSize()),
                    watch,
                )
                try:
                    messages = durable_rpc.durable_create(
                        durable,
                        request,
                        owner=owner_of(context),
                        key=idempotency_key(metadata),
                        timeout=context.time_remaining(),
                        caller=caller_of(context) if self.responses.hooked else None,
                        watch=watch,
                        admitted=admitted,
                    )
                    async with contextlib.aclosing(messages):
                        async for message in messages:
                            yield message
                finally:
                    admitted.done()
                    if admitted.kept:
                        reservation.set(None)  # the run gives it back, not the door
                watch.ended()
        except RequestError as err:
            await abort(context, err)

    async def AttachResponse(
        self, request: pb.AttachResponseRequest, context: Context
    ) -> AsyncIterator[EventMessage | EventBatch]:  # an AttachResponseResponse on the wire
        metadata = context.invocation_metadata() or ()
        try:
            # An attach reads a run that counts already (while it runs): it takes no slot of the
            # principal's limit, so a principal at its limit can still read its runs.
            async with self.edge.stream("AttachResponse", current_identity.get(), metadata, limited=False) as watch:
                durable = self.responses.durable
                if durable is None:
                    raise unavailable()
                field = ATTACH_EVENTS if request.batch_events else None
                messages = durable_rpc.attached(
                    durable, request.response_id, owner_of(context), request.starting_after, watch, field
                )
                async with contextlib.aclosing(messages):
                    async for message in messages:
                        yield message
                watch.ended()
        except RequestError as err:
            await abort(context, err)

    async def Converse(self, requests: AsyncIterator[pb.ConverseRequest], context: Context) -> None:
        metadata = context.invocation_metadata() or ()
        try:
            async with self.edge.stream("Converse", current_identity.get(), metadata) as watch:
                session = _Session(self.responses, self.edge, requests, context, watch)
                await session.serve(self.converse_idle_timeout)
                watch.ended()
        except RequestError as err:
            await abort(context, err)

    async def ControlResponse(self, request: pb.ControlResponseRequest, context: Context) -> pb.ControlResponseResponse:
        try:
            response = await self.responses.control(request.response_id, request.control, owner_of(context))
        except RequestError as err:
            await abort(context, err)
            raise AssertionError("unreachable") from err
        return pb.ControlResponseResponse(response=response)

    async def GetResponse(self, request: pb.GetResponseRequest, context: Context) -> pb.GetResponseResponse:
        try:
            return pb.GetResponseResponse(response=await self.responses.get(request.response_id, owner_of(context)))
        except RequestError as err:
            await abort(context, err)
            raise AssertionError("unreachable") from err

    async def DeleteResponse(self, request: pb.DeleteResponseRequest, context: Context) -> pb.DeleteResponseResponse:
        try:
            await self.responses.delete(request.response_id, owner_of(context))
        except RequestError as err:
            await abort(context, err)
        return pb.DeleteResponseResponse(response_id=request.response_id, deleted=True)

    async def CancelResponse(self, request: pb.CancelResponseRequest, context: Context) -> pb.CancelResponseResponse:
        try:
            return pb.CancelResponseResponse(
                response=await self.responses.cancel(request.response_id, owner_of(context))
            )
        except RequestError as err:
            await abort(context, err)
            raise AssertionError("unreachable") from err

    async def ListInputItems(self, request: pb.ListInputItemsRequest, context: Context) -> pb.ListInputItemsResponse:
        try:
            return await self.responses.list_input_items(
                request.response_id,
                limit=request.limit,
                after=request.after,
                descending=request.order == pb.ListOrder.LIST_ORDER_DESC,
                owner=owner_of(context),
            )
        except RequestError as err:
            await abort(context, err)
            raise AssertionError("unreachable") from err


class _Session:
    """One Converse stream: responses one after another, controls for the one running.

    A reader task takes the client's messages; this task writes. The client's messages that
    cannot be accepted are answered in-band (`rejected`), except a bad first message, which ends
    the stream with its status: nothing runs yet that it could harm."""

    def __init__(
        self,
        responses: Responses,
        edge: Edge,
        # A create refused admission before it was parsed comes as its RequestError (decode.py).
        requests: AsyncIterator[pb.ConverseRequest | RequestError],
        context: Context,
        watch: Watch,
    ) -> None:
        self.responses = responses
        self.edge = edge
        self.watch = watch
        self.requests = requests
        self.context = context
        self.owner = owner_of(context)
        self.caller = caller_of(context)
        # What the reader hands over: the next response to start, the error that ends the stream
        # (a bad first message), or None once the client has stopped sending.
        self.creates: asyncio.Queue[Create | RequestError | pb.AttachResponseRequest | None] = asyncio.Queue()
        self.run: Run | None = None
        # The response the session follows after an attach (its controls go there).
        self.attached: str | None = None
        # Controls that came while the response was being started: delivered once it runs.
        self.early: list[pb.Control] | None = None
        # One write at a time: events from this task, rejections from the reader.
        self.writing = asyncio.Lock()

    async def serve(self, idle_timeout: float = 0.0) -> None:
        """Responses one after another until the client stops sending, or until it has let
        `idle_timeout` seconds pass with none running (0: it may wait for ever)."""
        reader = asyncio.create_task(self._read())
        try:
            first = True
            while (next_create := await self._next(idle_timeout)) is not None:
                if isinstance(next_create, RequestError):
                    self.watch.refused(next_create)
                    await abort(self.context, next_create)
                    return
                if isinstance(next_create, pb.AttachResponseRequest):
                    await self._attach(next_create)
                    first = False
                    continue
                request, size, reserved = next_create
                request.stream = True  # a session always streams its events
                try:
                    if request.background:
                        if reserved is not None:
                            reserved.release()
                        raise invalid_argument([_NOT_HERE])
                    # Each response of the session is admitted apart, for as long as it runs:
                    # before its create was parsed (the reservation taken over), else now.
                    with self.edge.response(size, reserved) as admitted:
                        run = await self.responses.create(
                            request,
                            owner=self.owner,
                            timeout=self.context.time_remaining(),
                            controller=True,
                            caller=self.caller,
                        )
                        first = False
                        await self._stream(run, reader, admitted, request.batch_events)
                except RequestError as err:
                    self.early = None
                    self.watch.refused(err)
                    if first:
                        await abort(self.context, err)
                    await self._reject(err)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            # A create read but never started holds its reservation: given back.
            while not self.creates.empty():
                left = self.creates.get_nowait()
                if isinstance(left, tuple) and left[2] is not None:
                    left[2].release()

    async def _attach(self, request: pb.AttachResponseRequest) -> None:
        """Follow a response already running (its log), as a create's events would be."""
        durable = self.responses.durable
        try:
            if durable is None:
                raise unavailable()
            await durable.attach_check(request.response_id, self.owner, request.starting_after)
        except RequestError as err:
            self.attached = None
            self.watch.refused(err)
            await abort(self.context, err)
            return
        field = CONVERSE_EVENTS if request.batch_events else None
        pages = durable.follow_pages(request.response_id, self.owner, request.starting_after)
        try:
            async with contextlib.aclosing(logged_messages(pages, field, None)) as messages:
                async for message in messages:
                    async with self.writing:
                        await self.context.write(message)
        finally:
            self.attached = None

    async def _next(self, idle_timeout: float) -> Create | RequestError | pb.AttachResponseRequest | None:
        """What the reader hands over next; an idle_timeout error when nothing comes in time."""
        if not idle_timeout:
            return await self.creates.get()
        try:
            async with asyncio.timeout(idle_timeout):
                return await self.creates.get()
        except TimeoutError:
            return RequestError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no response ran on this stream for {idle_timeout:g} s (ANTWORT_CONVERSE_IDLE_TIMEOUT): "
                "open a new stream, and continue with previous_response_id",
                reason="idle_timeout",
            )

    async def _stream(self, run: Run, reader: asyncio.Task[None], admitted: Reservation, batched: bool = False) -> None:
        self.run = run
        early, self.early = self.early or [], None
        for control in early:
            await self._control(control)
        if reader.done():
            run.detach()
        try:
            async with contextlib.aclosing(run.events()) as events:
                if batched:
                    await self._stream_batched(run, events, admitted)
                    return
                async for event in events:
                    self.watch.saw(event)
                    if is_terminal(event):
                        self._ended(admitted)
                    async with self.writing:
                        await self.context.write(EventMessage(event, run.take_wire(event)))
        finally:
            self.run = None

    async def _stream_batched(
        self, run: Run, events: AsyncGenerator[pb.StreamEvent, None], admitted: Reservation
    ) -> None:
        async with contextlib.aclosing(batches(events, lambda: run.ended, is_terminal)) as batched:
            async for batch in batched:
                for event in batch:
                    self.watch.saw(event)
                if is_terminal(batch[-1]):
                    self._ended(admitted)
                async with self.writing:
                    for message in batch_messages(batch, run, CONVERSE_EVENTS):
                        await self.context.write(message)

    def _ended(self, admitted: Reservation) -> None:
        """The response's terminal event is about to be written. The client may send its next
        create the moment it reads it, while the run still winds down (the early model call
        discarded, the run let go of): the stream takes it from now, and the room the response
        was admitted in is given back, so that create is admitted as it comes."""
        self.run = None
        admitted.release()

    async def _read(self) -> None:
        try:
            first = True
            async for message in self.requests:
                if isinstance(message, RequestError):
                    # A create refused admission before it was parsed (the parsing door's).
                    if first:
                        self.creates.put_nowait(message)
                        return
                    self.watch.refused(message)
                    await self._reject(message)
                    continue
                # The room reserved for the message just read if it is a create, this task's to
                # hand over or give back.
                reserved = reservation.get()
                which = message.WhichOneof("message")
                if which != "create" and reserved is not None:
                    reserved.release()  # a create field, followed by another of the oneof
                if first and which == "attach":
                    self.attached = message.attach.response_id
                    self.creates.put_nowait(message.attach)
                    first = False
                    continue
                if which == "attach":
                    await self._reject(
                        invalid_argument([FieldViolation("attach", "only the first message of a session attaches")])
                    )
                    continue
                if first and which != "create":
                    violation = FieldViolation("create", "the first message of a session starts a response")
                    self.creates.put_nowait(invalid_argument([violation]))
                    return
                first = False
                if which == "create":
                    if self.run is not None or self.early is not None or self.attached is not None:
                        if reserved is not None:
                            reserved.release()
                        await self._reject(_busy())
                        continue
                    self.early = []
                    # The size of the message just read (the create and a few bytes of framing).
                    size = request_bytes.get() or message.create.ByteSize()
                    self.creates.put_nowait((message.create, size, reserved))
                elif which == "control":
                    await self._control(message.control)
                else:
                    await self._reject(invalid_argument([FieldViolation("message", "required: create or control")]))
        finally:
            # No more controls: nobody is left to decide approvals; no further responses.
            if self.run is not None:
                self.run.detach()
            self.creates.put_nowait(None)

    async def _control(self, control: pb.Control) -> None:
        violations = validate_control(control)
        try:
            if violations:
                raise invalid_argument(violations)
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
            await self.context.write(pb.ConverseResponse(rejected=rejection(err)))


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
