"""What the gateway keeps of a response: the Response itself and the input items of its request.

A conversation is a chain of stored responses linked by previous_response_id; rebuilding the
context walks that chain (see engine.history).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

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
