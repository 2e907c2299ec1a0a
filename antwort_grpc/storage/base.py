"""What the gateway keeps of a response: the Response itself and the input items of its request.

A conversation is a chain of stored responses linked by previous_response_id; rebuilding the
context walks that chain (see engine.history).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from antwort_grpc import pb


@dataclass(slots=True)
class StoredResponse:
    response: pb.Response
    # The items the request brought in (after expanding a plain-string input), with ids.
    input_items: list[pb.Item] = field(default_factory=list)
    # Who may read it; empty until authentication fills it in.
    owner: str = ""


@dataclass(slots=True)
class ItemPage:
    items: list[pb.Item]
    has_more: bool


class ResponseStore(Protocol):
    async def save(self, record: StoredResponse) -> None:
        """Insert or replace (by response id)."""
        ...

    async def get(self, response_id: str, owner: str = "") -> StoredResponse | None: ...

    async def delete(self, response_id: str, owner: str = "") -> bool: ...

    async def list_input_items(
        self, response_id: str, *, limit: int, after: str, descending: bool, owner: str = ""
    ) -> ItemPage | None:
        """None when the response does not exist (for this owner)."""
        ...


# -- What durable stores add, as separate small protocols (a caller checks with isinstance). ------


@runtime_checkable
class CancelSignals(Protocol):
    """Cancel a response wherever it runs: on this process or on another gateway replica."""

    async def request_cancel(self, response_id: str) -> bool:
        """Ask the process running the response to stop it. False when no such response is in
        progress (unknown, expired, or already ended)."""
        ...

    def on_cancel(self, callback: Callable[[str], None]) -> None:
        """Call `callback(response_id)` (on the event loop) for every cancel requested for a
        response this process runs. Delivery may repeat; stopping is idempotent."""
        ...


@runtime_checkable
class Recovery(Protocol):
    """Responses left in progress by a gateway process that died."""

    async def mark_interrupted(self) -> int:
        """Mark them FAILED with error code `interrupted`; how many were marked."""
        ...


@runtime_checkable
class Retention(Protocol):
    async def purge_expired(self) -> int:
        """Delete responses whose TTL has passed; how many were deleted."""
        ...


@runtime_checkable
class Closable(Protocol):
    async def close(self) -> None: ...


# The error code of a response whose gateway process died while it ran.
INTERRUPTED = "interrupted"
