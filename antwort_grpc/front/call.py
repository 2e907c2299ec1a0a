"""What a door hands the core for one request: who calls (`Call`), the request as it arrived when
it should be admitted before it is decoded (`Encoded`), and where the events go (`Sink`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from antwort_grpc import pb
from antwort_grpc.auth.identity import Identity
from antwort_grpc.errors import RequestError
from antwort_grpc.hooks.service import Caller

Metadata = Collection[tuple[str, Any]]
T_co = TypeVar("T_co", covariant=True)


@dataclass(slots=True)
class Call:
    """One request as its door read it: the method (what metrics and traces name it), the
    caller's identity (None without authentication), its metadata (lower-case names: traceparent,
    idempotency-key, …), the time it has left, and a non-gRPC door's trace attributes."""

    method: str
    identity: Identity | None = None
    metadata: Metadata = ()
    timeout: float | None = None
    door: dict[str, str] | None = None

    @property
    def owner(self) -> str:
        """Whose responses the caller sees ("" without authentication)."""
        return self.identity.owner if self.identity is not None else ""

    def caller(self) -> Caller:
        """Who calls and the trace they call in, for hook services."""
        return dataclasses.replace(Caller.from_metadata(self.metadata), owner=self.owner)


class Encoded(Protocol[T_co]):
    """A request that starts a response, as it came off the wire: admitted by its size before it
    is decoded (decoding makes several times its bytes in objects, which a refused request should
    not have cost). On a session, `starts_response` says whether a message is one (False: decoded
    without admission)."""

    starts_response: bool

    @property
    def size(self) -> int: ...

    def too_large(self, limit: int) -> RequestError:
        """The refusal of a request past `limit` bytes (naming where its bytes are)."""
        ...

    async def decode(self) -> T_co:
        """The request; RequestError (INVALID_ARGUMENT naming the field) when it does not decode."""
        ...


class Sink(Protocol):
    """Where a response's events go, in the door's encoding. The core calls one method per
    message the door should send; an exception from it (the client went away) ends the call."""

    # Whether `event` uses the bytes the engine kept of an event it serialized already (the gRPC
    # door sends them as they are); False: it is handed None, and no bytes are looked up per event.
    takes_wire: bool

    def event(self, event: pb.StreamEvent, wire: bytes | None) -> Awaitable[None]:
        """One event; `wire`: its bytes when the engine serialized it already (else None). A
        coroutine, or the door's own write returned as it is (no coroutine of ours per event)."""
        ...

    async def batch(self, events: Sequence[pb.StreamEvent], wires: Sequence[bytes]) -> None:
        """Events produced at the same moment (a request's batch_events), in order, each with its
        bytes."""
        ...

    async def logged(self, wires: Sequence[bytes], batched: bool) -> None:
        """Serialized events read together from a background response's log; `batched`: the
        client asked for them together (batch_events)."""
        ...
