"""An in-process store: for tests and for a gateway that needs no durability."""

from __future__ import annotations

from antwort_grpc import pb
from antwort_grpc.storage.base import ItemPage, StoredResponse


class MemoryStore:
    def __init__(self) -> None:
        self._records: dict[str, StoredResponse] = {}

    async def save(self, record: StoredResponse) -> None:
        # Copy so later mutation of the caller's Response cannot change what is stored.
        response = pb.Response()
        response.CopyFrom(record.response)
        self._records[response.id] = StoredResponse(response, list(record.input_items), record.owner)

    async def get(self, response_id: str, owner: str = "") -> StoredResponse | None:
        record = self._records.get(response_id)
        if record is None or record.owner != owner:
            return None
        return record

    async def delete(self, response_id: str, owner: str = "") -> bool:
        if await self.get(response_id, owner) is None:
            return False
        del self._records[response_id]
        return True

    async def list_input_items(
        self, response_id: str, *, limit: int, after: str, descending: bool, owner: str = ""
    ) -> ItemPage | None:
        record = await self.get(response_id, owner)
        if record is None:
            return None
        return page_items(record.input_items, limit=limit, after=after, descending=descending)


def page_items(items: list[pb.Item], *, limit: int, after: str, descending: bool) -> ItemPage:
    """Cursor pagination over an ordered item list (shared by stores that keep items whole)."""
    ordered = list(reversed(items)) if descending else items
    start = 0
    if after:
        for i, item in enumerate(ordered):
            if item.id == after:
                start = i + 1
                break
        else:
            return ItemPage([], False)
    chunk = ordered[start : start + limit]
    return ItemPage(chunk, start + limit < len(ordered))
