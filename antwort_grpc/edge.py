"""The neutral edge around the responses layer, the same for every front door: who is calling (a
credential becomes an Identity), whether their response may start (each principal's limit of
responses at once; the gateway's limit of responses running and of the memory their requests
hold), and observing each response stream (metrics, traces, the log line).

A door (the gRPC servicer today) only converts: it hands the edge the credential it read and the
metadata it got, wraps the response stream it serves in `Edge.stream`, and turns the RequestErrors
raised here into its own errors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace

from antwort_grpc import pb
from antwort_grpc.auth.identity import Authenticator, AuthError, Identity
from antwort_grpc.errors import RequestError
from antwort_grpc.grpc_security import identify
from antwort_grpc.loop_lag import LoopLag
from antwort_grpc.observability.context import Observation, current_observation
from antwort_grpc.observability.observer import Observer

Metadata = Collection[tuple[str, Any]]


class ConcurrencyLimit:
    """How many responses each principal runs at once, across its connections (and doors)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running: dict[str, int] = {}

    def acquire(self, principal: str) -> bool:
        count = self.running.get(principal, 0)
        if count >= self.limit:
            return False
        self.running[principal] = count + 1
        return True

    def release(self, principal: str) -> None:
        count = self.running.get(principal, 0) - 1
        if count > 0:
            self.running[principal] = count
        else:
            self.running.pop(principal, None)

    def count(self, principal: str) -> None:
        """A response of this principal's that runs here without having asked (a background run
        taken over from another replica: it was admitted where it started): it counts against
        the limit for as long as it runs, even above it."""
        self.running[principal] = self.running.get(principal, 0) + 1


# What a running response is estimated to hold: its request's bytes this many times over (the
# parsed request, the input items and tools copied into the run and the Response, the backend
# body, the stored copy: 40 requests of 8 MB took the process from 78 to 1,949 MiB, 5.6 times),
# plus what any response holds, however small its request (about 70 KiB measured per open
# stream, bench/RESULTS.md).
MEMORY_PER_REQUEST_BYTE = 6
MEMORY_PER_RESPONSE = 64 * 1024
# How long a refused client is asked to wait before it tries again (grpc-retry-pushback-ms,
# google.rpc.RetryInfo): about what a response at the limits takes to run.
RETRY_PUSHBACK = 1.0


def estimated_memory(request_bytes: int) -> int:
    return MEMORY_PER_RESPONSE + MEMORY_PER_REQUEST_BYTE * request_bytes


class Admission:
    """What the whole gateway runs at once, whoever asks: responses, and the memory their
    requests are estimated to hold (`estimated_memory`). 0: no limit.

    A response that does not fit is refused before any work starts, never queued: the client is
    told to come back (RESOURCE_EXHAUSTED with a retry pushback), and another replica may have
    room. A response larger than the whole budget is let through when nothing else runs, so
    every request the message limits accept can run.

    Room is taken as a Reservation, by the request's size on the wire: the gRPC door reserves it
    before it parses the request (a refused request then costs only its bytes), and the response
    takes the reservation over when it starts."""

    def __init__(
        self, max_running: int = 0, memory_budget: int = 0, max_lag: float = 0.0, lag: LoopLag | None = None
    ) -> None:
        self.max_running = max_running
        self.memory_budget = memory_budget
        self.running = 0
        self.memory = 0
        # Seconds the event loop may run behind (averaged, `lag`) before new responses are
        # refused; 0: no such bound.
        self.max_lag = max_lag
        self.lag = lag or LoopLag()

    def refusal(self, cost: int) -> RequestError | None:
        """Why a response of this cost may not start now (None: it may)."""
        if self.max_running and self.running >= self.max_running:
            return _busy(f"the gateway runs at most {self.max_running} responses at once", "too_many_running")
        if self.max_lag and self.running and self.lag.lag > self.max_lag:
            return _busy(
                f"the gateway's event loop runs {self.lag.lag * 1000:.0f} ms behind "
                f"(ANTWORT_ADMISSION_MAX_LAG {self.max_lag * 1000:.0f} ms)",
                "overloaded",
            )
        if self.memory_budget and self.running and self.memory + cost > self.memory_budget:
            return _busy(
                f"the responses running hold the gateway's memory budget ({self.memory_budget / 2**20:.0f} MiB); "
                f"this request would need about {cost / 2**20:.1f} MiB more",
                "memory_budget",
            )
        return None

    def room(self) -> int:
        """How many more responses could start now, by the running cap and the memory a response
        holds at least (a large number: no cap)."""
        if self.memory_budget and self.running and self.memory + MEMORY_PER_RESPONSE > self.memory_budget:
            return 0
        if self.max_running:
            return max(0, self.max_running - self.running)
        return 1 << 30

    def take(self, request_bytes: int) -> Reservation:
        """Room for a response that was let in already (a background run taken over from
        another replica, after `room` said there was some): counted, never refused."""
        cost = estimated_memory(request_bytes)
        self.running += 1
        self.memory += cost
        return Reservation(self, cost)

    def reserve(self, request_bytes: int) -> Reservation:
        """Room for one response of a request this large (serialized), held until the
        reservation is released; RequestError (RESOURCE_EXHAUSTED, retry pushback) when there
        is none."""
        cost = estimated_memory(request_bytes)
        refused = self.refusal(cost)
        if refused is not None:
            raise refused
        self.running += 1
        self.memory += cost
        return Reservation(self, cost)

    @contextmanager
    def hold(self, request_bytes: int, reserved: Reservation | None = None) -> Iterator[Reservation]:
        """One response of a request this large, for as long as it runs: the room `reserved` for
        it (taken over: released when the response ends), else room reserved now."""
        reservation = reserved if reserved is not None else self.reserve(request_bytes)
        try:
            yield reservation
        finally:
            reservation.release()


class Reservation:
    """Room of the admission for one response. Released once: by the response when it ends, or
    by the door that reserved it when the response never starts (the request does not parse,
    or is refused by a later check); a second release does nothing."""

    __slots__ = ("_admission", "cost")

    def __init__(self, admission: Admission, cost: int) -> None:
        self._admission: Admission | None = admission
        self.cost = cost

    @property
    def held(self) -> bool:
        return self._admission is not None

    def release(self) -> None:
        admission, self._admission = self._admission, None
        if admission is not None:
            admission.running -= 1
            admission.memory -= self.cost


def _busy(message: str, reason: str) -> RequestError:
    return RequestError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"{message}: try again later",
        reason=reason,
        retry_after=RETRY_PUSHBACK,
    )


class Watch:
    """One response stream as the edge sees it, entered with `async with` for as long as it runs:
    a slot of its principal's limit (RESOURCE_EXHAUSTED when none is free) and its observation
    (current for the stream's task and every task it starts, so model and tool calls hang under
    its span). Every event it carries goes through `saw` when `observing`.

    A plain class rather than an asynccontextmanager: it is entered once per response."""

    __slots__ = (
        "_door",
        "_edge",
        "_metadata",
        "_method",
        "_observation",
        "_principal",
        "_slot",
        "_token",
        "cut",
        "observing",
        "saw",
    )

    def __init__(
        self,
        edge: Edge,
        method: str,
        identity: Identity | None,
        metadata: Metadata,
        door: dict[str, str] | None = None,
        limited: bool = True,
    ) -> None:
        self._edge = edge
        # Whether the stream holds a slot of its principal's limit (it runs a response).
        self._slot = limited and edge.limit is not None
        self._door = door
        self._method = method
        self._principal = identity.principal if identity is not None else ""
        self._metadata = metadata
        self._observation: Observation | None = None
        self._token: object | None = None
        self.observing = edge.observer is not None
        # How the stream ended if it ends early: refused before its first event, or cut after it.
        self.cut = "refused"
        # Called with every event the stream carries: the observer's look at it once the stream
        # is entered (one call per event, made for the stream), else only the note that one went.
        self.saw: Callable[[pb.StreamEvent], None] = self._went

    async def __aenter__(self) -> Watch:
        edge = self._edge
        limit = edge.limit
        if self._slot and limit is not None and not limit.acquire(self._principal):
            self._slot = False
            refusal = RequestError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"at most {limit.limit} responses may run at once for one caller",
                reason="too_many_responses",
            )
            edge.refused(self._method, refusal)
            raise refusal
        if edge.observer is not None:
            observation = self._observation = edge.observer.begin(self._method, self._metadata, self._door)
            current_observation.set(observation)
            self.saw = edge.observer.looking(observation, self._metadata)
            if observation.span is not None:
                self._token = otel_context.attach(trace.set_span_in_context(observation.span))
        return self

    async def __aexit__(self, kind: object, error: object, traceback: object) -> None:
        edge = self._edge
        cut = self.cut
        if cut == "refused" and self._observation is not None and self._observation.seen:
            cut = "client_gone"
        if isinstance(error, RequestError) and cut == "refused":
            edge.refused(self._method, error)
        if edge.observer is not None and self._observation is not None:
            edge.observer.end(self._observation, cut)
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
        if self._slot and edge.limit is not None:
            edge.limit.release(self._principal)

    def keep_slot(self) -> Callable[[], None] | None:
        """The stream's slot of its principal's limit, taken over by what goes on running after
        the stream (a background run): released by calling what this returns, not by the
        stream's end. None: the stream holds no slot."""
        limit = self._edge.limit
        if not self._slot or limit is None:
            return None
        self._slot = False
        principal = self._principal
        return lambda: limit.release(principal)

    def _went(self, event: pb.StreamEvent) -> None:
        self.cut = "client_gone"

    def ended(self) -> None:
        """The stream ran to its end (not cut)."""
        self.cut = "stream_ended"

    def refused(self, error: RequestError) -> None:
        """A response this stream asked for was refused before it started (a Converse session
        answers such a create in-band, or ends with it when it is the first)."""
        self._edge.refused(self._method, error)


@dataclass(eq=False)
class Edge:
    authenticator: Authenticator | None = None
    limit: ConcurrencyLimit | None = None
    observer: Observer | None = None
    admission: Admission = field(default_factory=Admission)
    # How many background responses each principal runs at once (None: no limit of its own).
    background: ConcurrencyLimit | None = None

    def background_slot(self, method: str, identity: Identity | None) -> Callable[[], None]:
        """A place among the principal's background runs, held until what this returns is
        called; RESOURCE_EXHAUSTED (too_many_background) when it has none left."""
        limit = self.background
        if limit is None:
            return _nothing
        principal = identity.principal if identity is not None else ""
        if not limit.acquire(principal):
            refusal = RequestError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"at most {limit.limit} background responses may run at once for one caller "
                "(ANTWORT_BACKGROUND_SHARE of the running cap)",
                reason="too_many_background",
                retry_after=RETRY_PUSHBACK,
            )
            self.refused(method, refusal)
            raise refusal
        return lambda: limit.release(principal)

    @property
    def authenticates(self) -> bool:
        return self.authenticator is not None

    async def identify(self, credential: str | AuthError, method: str = "") -> Identity:
        """The caller a credential names (or the door's reason it has none); UNAUTHENTICATED else."""
        assert self.authenticator is not None
        try:
            if isinstance(credential, AuthError):
                raise credential
            return await identify(self.authenticator, credential)
        except AuthError as err:
            refusal = RequestError(grpc.StatusCode.UNAUTHENTICATED, str(err), reason="unauthenticated")
            self.refused(method, refusal)
            raise refusal from None

    def refused(self, method: str, error: RequestError) -> None:
        """A request refused before it started, counted whichever part of a door refused it."""
        if self.observer is not None:
            self.observer.refused(method, error)

    def stream(
        self,
        method: str,
        identity: Identity | None,
        metadata: Metadata,
        door: dict[str, str] | None = None,
        limited: bool = True,
    ) -> Watch:
        """A response stream of `identity`'s, to enter with `async with` (see Watch); `door`: the
        trace attributes of a door that is not gRPC; `limited` False: the stream only reads a
        response that counts already (an attach), so it takes no slot of the principal's limit."""
        return Watch(self, method, identity, metadata, door, limited)

    def response(
        self, request_bytes: int, reserved: Reservation | None = None
    ) -> contextlib.AbstractContextManager[Reservation]:
        """One response of a request this large (serialized), admitted for as long as it runs (on
        a Converse stream, each response apart): in the room `reserved` for it before its request
        was parsed (taken over), else in room reserved now; RequestError RESOURCE_EXHAUSTED when
        the gateway has no room."""
        return self.admission.hold(request_bytes, reserved)

    # -- background runs taken over from another replica (responses/background.py) ------------------

    def room(self) -> int:
        """How many runs this replica could take over now without going over its running cap."""
        return self.admission.room()

    def resumed(self, owner: str, request_bytes: int) -> Callable[[], None]:
        """A background run taken over here, counted against the gateway's admission and (when
        its owner names the principal) the principal's limit for as long as it runs; what
        releases it. A tenant's run counts against the gateway only: the store keeps the owner,
        not which of the tenant's principals started it."""
        reservation = self.admission.take(request_bytes)
        limit = self.limit
        principal = principal_of(owner)
        if limit is None or principal is None:
            return reservation.release
        limit.count(principal)

        def release() -> None:
            reservation.release()
            limit.release(principal)

        return release


def _nothing() -> None:
    pass


def principal_of(owner: str) -> str | None:
    """The principal an owner names (Identity.owner): "" without authentication, None for a
    tenant (any of its principals)."""
    if not owner:
        return ""
    kind, _, name = owner.partition(":")
    return name if kind == "principal" else None
