"""What the gateway keeps of a response: the Response itself and the input items of its request.

A conversation is a chain of stored responses linked by previous_response_id; rebuilding the
context walks that chain (see engine.history).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from antwort_grpc import pb

S = pb.ResponseStatus
# Statuses of a response some gateway process is still working on.
RUNNING: frozenset[int] = frozenset({S.RESPONSE_STATUS_QUEUED, S.RESPONSE_STATUS_IN_PROGRESS})
# The error code of a response whose gateway process stopped while it ran.
INTERRUPTED = "interrupted"


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
        """Insert or replace (by response id). A save never takes a response back from a final
        status to a running one: a late in-progress write cannot undo the end."""
        ...

    async def get(self, response_id: str, owner: str = "") -> StoredResponse | None: ...

    async def delete(self, response_id: str, owner: str = "") -> bool: ...

    async def list_input_items(
        self, response_id: str, *, limit: int, after: str, descending: bool, owner: str = ""
    ) -> ItemPage | None:
        """None when the response does not exist (for this owner)."""
        ...


@runtime_checkable
class ItemLookup(Protocol):
    """Items of stored responses by id: what an input's item references name."""

    async def find_items(self, item_ids: Sequence[str], owner: str = "") -> dict[str, pb.Item]:
        """The items with these ids among `owner`'s stored responses that have ended (an input or
        an output item; the latest response that holds one), by id. An id found nowhere, or only
        in another owner's or an expired response, is missing from the answer."""
        ...


@runtime_checkable
class CancelSignals(Protocol):
    """Cancel a response wherever it runs: in this process or on another gateway replica."""

    async def request_cancel(self, response_id: str, owner: str = "") -> bool:
        """Ask the process running the response to stop it. False when no such response is in
        progress (unknown, another owner's, or already ended)."""
        ...

    def on_cancel(self, callback: Callable[[str], object]) -> Callable[[], None]:
        """Call `callback(response_id)` on the event loop for every cancel requested for a
        response this process runs; returns the function that unsubscribes. Delivery may
        repeat: stopping must be idempotent."""
        ...


@runtime_checkable
class ControlSignals(Protocol):
    """Deliver a control to the replica that runs a response, and hear its answer."""

    async def send_control(self, response_id: str, owner: str, control: pb.Control) -> pb.ControlRejected | None:
        """The running replica's answer (code 0: accepted), or None when none answered in time."""
        ...

    def on_control(self, callback: Callable[[str, pb.Control], pb.ControlRejected]) -> Callable[[], None]:
        """Call `callback(response_id, control)` for every control sent to a response this process
        runs; its answer goes back to the sender. Returns the function that unsubscribes."""
        ...


@runtime_checkable
class Closable(Protocol):
    async def close(self) -> None:
        """Stop background work and release the database. What this process still ran is
        marked FAILED/interrupted: nothing will finish it."""
        ...
