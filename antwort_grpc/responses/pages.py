"""Lists of items as every list answers them: a page of 1 to 100 items (20 unless asked), and the
ids of its first and last items."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from antwort_grpc import pb
from antwort_grpc.errors import FieldViolation, invalid_argument

DEFAULT_LIMIT = 20
MOST = 100

ItemList = TypeVar(
    "ItemList", pb.ListInputItemsResponse, pb.ListConversationItemsResponse, pb.CreateConversationItemsResponse
)


def page_limit(limit: int) -> int:
    """The page size a list asked for (0: the default); INVALID_ARGUMENT outside 1 to 100."""
    limit = limit or DEFAULT_LIMIT
    if not 1 <= limit <= MOST:
        raise invalid_argument([FieldViolation("limit", f"must be between 1 and {MOST}")])
    return limit


def item_list(message: type[ItemList], items: Sequence[pb.Item], has_more: bool = False) -> ItemList:
    return message(
        items=items,
        first_id=items[0].id if items else "",
        last_id=items[-1].id if items else "",
        has_more=has_more,
    )
