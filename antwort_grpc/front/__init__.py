"""The core's one entry per request, the same for every door.

A door decodes what it received, calls one method here with the `Call` (who calls, how), the
request (decoded, or `Encoded` when it starts a response: admitted by its size before it is
decoded) and a `Sink` for the events, and encodes what comes back; RequestErrors it maps to its
own errors. Everything else happens here, once for every door: admission, identity checks of a
credential, observation (metrics, traces, the log line), background and idempotent creates, the
non-streaming drain, batching, attaching to a log, controls, compaction, and refusing new work
once the process stops taking it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TypeVar, cast

import grpc
from google.protobuf.message import Message

from antwort_grpc import pb
from antwort_grpc.auth.identity import AuthError, Identity
from antwort_grpc.durable.creates import Begun, Durability, idempotency_key, unavailable
from antwort_grpc.edge import Edge, Reservation, Watch
from antwort_grpc.errors import RequestError
from antwort_grpc.front.call import Call, Encoded, Metadata, Sink
from antwort_grpc.front.compaction import Compacted, summarizing_request, summary_of
from antwort_grpc.front.controls import CONTROLS
from antwort_grpc.front.conversations import ConversationsFront
from antwort_grpc.front.creates import Last, deliver, follow, wants_durable
from antwort_grpc.front.session import ConverseSink, Session
from antwort_grpc.front.stalls import Guard, StallWatch
from antwort_grpc.hooks.service import Caller
from antwort_grpc.responses.request_limits import Limits
from antwort_grpc.responses.service import Responses, rejection

__all__ = ["CONTROLS", "Call", "Compacted", "ConverseSink", "Encoded", "Front", "Metadata", "Sink", "rejection"]

T = TypeVar("T")
M = TypeVar("M", bound=Message)

# How long a client refused during shutdown is asked to wait: another replica takes it meanwhile.
CLOSING_RETRY = 1.0


class Front:
    def __init__(
        self,
        responses: Responses,
        edge: Edge,
        durable: Durability | None = None,
        converse_idle_timeout: float = 0.0,
        write_timeout: float = 0.0,
        background_max_duration: float = 0.0,
    ) -> None:
        self.responses = responses
        self.edge = edge
        self.durable = durable
        # A stream whose client reads nothing for this long is ended (stalls.py); 0: never.
        self.stalls = StallWatch(write_timeout)
        # What bounds a background response that bounds itself by nothing; 0: nothing.
        self.background_max_duration = background_max_duration
        # Seconds a Converse session may wait with no response running; 0: for ever.
        self.converse_idle_timeout = converse_idle_timeout
        # Set by the process root when the drain ends: from then on every door refuses new work.
        self.closing = False
        # The conversation resources (front/conversations.py).
        self.conversations = ConversationsFront(self)

    @property
    def authenticates(self) -> bool:
        return self.edge.authenticates

    @property
    def observed(self) -> bool:
        """Whether requests are observed (metrics, traces): a door's trace attributes are wanted."""
        return self.edge.observer is not None

    @property
    def limits(self) -> Limits:
        """What one request may hold: a door checks what it can while decoding (counts before
        mapping, bytes before reading)."""
        return self.responses.limits

    # -------------------------------------------------------------------------- who calls

    async def identify(self, credential: str | AuthError, method: str = "") -> Identity:
        """The caller a credential names (or the door's reason it has none); UNAUTHENTICATED else."""
        return await self.edge.identify(credential, method)

    def refuse(self, method: str, error: RequestError) -> None:
        """A request its door refused before it reached the core (it did not decode, or carried no
        valid credential): counted as the core counts its own refusals."""
        self.edge.refused(method, error)

    def check_open(self, method: str) -> None:
        """UNAVAILABLE (shutting_down) once the process stops taking work."""
        if self.closing:
            refusal = RequestError(
                grpc.StatusCode.UNAVAILABLE,
                "the gateway is shutting down: send the request again (another replica takes it)",
                reason="shutting_down",
                retry_after=CLOSING_RETRY,
            )
            self.edge.refused(method, refusal)
            raise refusal

    # ---------------------------------------------------------------------------- creates

    async def create(
        self, call: Call, request: pb.CreateResponseRequest | Encoded[pb.CreateResponseRequest], sink: Sink
    ) -> None:
        """Run a response and send its events: every event when the request streams (batched when
        it asks), else only the last (a non-streaming answer drains the same stream). A background
        or idempotent create goes through `durable`."""
        request, size, reserved = await self._taken(call, request, pb.CreateResponseRequest)
        if wants_durable(request.background, call.metadata):
            # It owns the reservation from here (a background run keeps it until it ends).
            await self._durable_create(call, request, size, reserved, sink)
            return
        try:
            edge = self.edge
            async with edge.stream(call.method, call.identity, call.metadata, call.door) as watch:
                # Admitted before it was decoded (the reservation taken over), else now.
                with edge.response(size, reserved):
                    run = await self.responses.create(
                        request, owner=call.owner, timeout=call.timeout, caller=self._caller(call)
                    )
                    guard = self.stalls.guard()
                    try:
                        await deliver(run, request, watch, sink, guard)
                    finally:
                        self.stalls.release(guard)
        finally:
            if reserved is not None:
                reserved.release()  # taken over by the response (then released already), else here

    async def _durable_create(
        self, call: Call, request: pb.CreateResponseRequest, size: int, reserved: Reservation | None, sink: Sink
    ) -> None:
        kept = False
        holds: list[Callable[[], None]] = [reserved.release] if reserved is not None else []
        try:
            async with self.edge.stream(call.method, call.identity, call.metadata, call.door) as watch:
                durable = self.durability()
                # Admitted as any create; a background run keeps its room, and its slot of the
                # principal's limit, until it ends here.
                if reserved is None:
                    reserved = self.edge.admission.reserve(size)
                    holds.append(reserved.release)
                if request.background:
                    holds.append(self.edge.background_slot(call.method, call.identity))
                    request = self._bounded(request)
                key = idempotency_key(call.metadata)
                begun = await durable.begin(
                    request, owner=call.owner, key=key, timeout=call.timeout, caller=self._caller(call)
                )
                runner = begun.runner
                if runner is not None:
                    kept = True
                    for release in holds:
                        runner.hold(release)
                    slot = watch.keep_slot()
                    if slot is not None:
                        runner.hold(slot)
                guard = self.stalls.guard()
                try:
                    await self._answer_begun(call, request, durable, begun, watch, sink, guard)
                finally:
                    self.stalls.release(guard)
                watch.ended()
        finally:
            if not kept:
                for release in holds:
                    release()

    def _bounded(self, request: pb.CreateResponseRequest) -> pb.CreateResponseRequest:
        """A background request with the default bound of its duration when it has none (nobody
        is connected to end it)."""
        default = self.background_max_duration
        if not default or request.limits.HasField("max_duration") or self.responses.engine.server_limits.max_duration:
            return request
        bounded = pb.CreateResponseRequest()
        bounded.CopyFrom(request)
        bounded.limits.max_duration.FromNanoseconds(int(default * 1e9))
        return bounded

    async def _answer_begun(
        self,
        call: Call,
        request: pb.CreateResponseRequest,
        durable: Durability,
        begun: Begun,
        watch: Watch,
        sink: Sink,
        guard: Guard,
    ) -> None:
        """What a background or idempotent create answers."""
        runner = begun.runner
        if begun.run is not None and runner is None:
            # An idempotent create that is not background: this call owns it, as any create.
            await deliver(begun.run, request, watch, sink, guard)
        elif request.stream and begun.logged:
            await durable.attach_check(begun.response_id, call.owner, 0)
            await follow(durable, begun.response_id, call.owner, 0, watch, sink, guard, request.batch_events)
        else:
            # At once, the background run's first event; else, a retried create, the response as
            # stored (one that is not background: once it ended).
            if runner is not None:
                event, wire = await runner.first
            else:
                event, wire = await durable.stored_answer(begun, call.owner), None
            watch.saw(event)
            guard.writing = True
            await sink.event(event, wire)

    async def attach(
        self,
        call: Call,
        response_id: str,
        starting_after: int,
        sink: Sink,
        batched: bool = False,
        read_from: int | None = None,
    ) -> None:
        """A background response's events after `starting_after`, from its log, to the terminal
        one. It reads a response that counts already: no slot of the principal's limit.
        `read_from`: the log is read after this number instead (`starting_after` is still checked
        against the log), for a door whose sink numbers the events its own way."""
        self.check_open(call.method)
        async with self.edge.stream(call.method, call.identity, call.metadata, call.door, limited=False) as watch:
            durable = self.durability()
            await durable.attach_check(response_id, call.owner, starting_after)
            guard = self.stalls.guard()
            try:
                after = starting_after if read_from is None else read_from
                await follow(durable, response_id, call.owner, after, watch, sink, guard, batched)
            finally:
                self.stalls.release(guard)
            watch.ended()

    async def converse(
        self, call: Call, requests: AsyncIterator[Encoded[pb.ConverseRequest]], sink: ConverseSink
    ) -> None:
        """A session: responses one after another on one stream, controls for the one running."""
        self.check_open(call.method)
        async with self.edge.stream(call.method, call.identity, call.metadata, call.door) as watch:
            guard = self.stalls.guard()
            try:
                await Session(self, call, requests, sink, watch, guard).serve(self.converse_idle_timeout)
            finally:
                self.stalls.release(guard)
            watch.ended()

    async def compact(
        self, call: Call, request: pb.CompactConversationRequest | Encoded[pb.CompactConversationRequest]
    ) -> Compacted:
        """The conversation summarized by the model into one item that stands for it as input."""
        request, size, reserved = await self._taken(call, request, pb.CompactConversationRequest)
        try:
            summarize = summarizing_request(request)
            async with self.edge.stream(call.method, call.identity, call.metadata, call.door) as watch:
                with self.edge.response(size, reserved):
                    run = await self.responses.create(summarize, owner=call.owner, caller=self._caller(call))
                    run.keep_out_of_conversation()
                    last = Last()
                    await deliver(run, summarize, watch, last, Guard(None))
                    response = last.response()
        finally:
            if reserved is not None:
                reserved.release()
        return summary_of(response)

    async def _taken(
        self, call: Call, request: M | Encoded[M], decoded_type: type[M]
    ) -> tuple[M, int, Reservation | None]:
        """A request that starts a response, taken in: decoded already (its size measured), or
        admitted by its size first and then decoded (the room reserved for it returned)."""
        self.check_open(call.method)
        if isinstance(request, decoded_type):
            return request, request.ByteSize(), None
        encoded = cast("Encoded[M]", request)
        reserved = self.admit(call, encoded)
        return await self.decoded(call, encoded, reserved), encoded.size, reserved

    def admit(self, call: Call, request: Encoded[object], counted: bool = True) -> Reservation:
        """Room for a response of this request, by its size, before it is decoded. `counted`
        False: a refusal is counted by whoever it is raised to (a session's watch)."""
        try:
            limit = self.responses.limits.max_request_bytes
            size = request.size
            if limit and size > limit:
                raise request.too_large(limit)
            return self.edge.admission.reserve(size)
        except RequestError as err:
            if counted:
                self.edge.refused(call.method, err)
            raise

    async def decoded(self, call: Call, request: Encoded[T], reserved: Reservation, counted: bool = True) -> T:
        """The request decoded; the room reserved for it given back when it does not decode."""
        try:
            decoded: T = await request.decode()
        except BaseException as err:
            reserved.release()
            if counted and isinstance(err, RequestError):
                self.edge.refused(call.method, err)
            raise
        return decoded

    def _caller(self, call: Call) -> Caller | None:
        """Who calls, for the hook services (None: no hooks to tell)."""
        return call.caller() if self.responses.hooked else None

    def durability(self) -> Durability:
        if self.durable is None:
            raise unavailable()
        return self.durable

    # ------------------------------------------------------------- reads and controls

    async def get(self, call: Call, response_id: str) -> pb.Response:
        self.check_open(call.method)
        return await self.responses.get(response_id, call.owner)

    async def delete(self, call: Call, response_id: str) -> None:
        self.check_open(call.method)
        await self.responses.delete(response_id, call.owner)

    async def cancel(self, call: Call, response_id: str) -> pb.Response:
        self.check_open(call.method)
        return await self.responses.cancel(response_id, call.owner)

    async def control(self, call: Call, response_id: str, control: pb.Control) -> pb.ControlAccepted:
        self.check_open(call.method)
        return await self.responses.control(response_id, control, call.owner)

    async def list_input_items(
        self, call: Call, response_id: str, *, limit: int, after: str, descending: bool
    ) -> pb.ListInputItemsResponse:
        self.check_open(call.method)
        return await self.responses.list_input_items(
            response_id, limit=limit, after=after, descending=descending, owner=call.owner
        )

    async def logged(self, call: Call, response_id: str) -> bool:
        """Whether a response was created in background (its event log is kept)."""
        durable = self.durable
        return durable is not None and await durable.runlog.state(response_id, call.owner) is not None
