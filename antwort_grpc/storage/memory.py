"""An in-process store: for tests and for a gateway that needs no durability."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from antwort_grpc import pb
from antwort_grpc.storage.base import ItemPage, StoredResponse
from antwort_grpc.storage.codec import RUNNING, interrupted
from antwort_grpc.storage.maintenance import CancelCallbacks
from antwort_grpc.storage.options import StoreOptions


@dataclass(slots=True)
class _Entry:
    record: StoredResponse
    instance: str
    expires_at: float | None


@dataclass(slots=True)
class MemoryDatabase:
    """What a MemoryStore keeps; several stores may share one, as replicas share a database."""

    entries: dict[str, _Entry] = field(default_factory=dict)


class MemoryStore:
    def __init__(self, options: StoreOptions | None = None, database: MemoryDatabase | None = None) -> None:
        self.options = options or StoreOptions()
        self.database = database or MemoryDatabase()
        self._cancels = CancelCallbacks()

    @property
    def _entries(self) -> dict[str, _Entry]:
        return self.database.entries

    async def save(self, record: StoredResponse) -> None:
        # Copy so later mutation of the caller's Response cannot change what is stored.
        response = pb.Response()
        response.CopyFrom(record.response)
        self._entries[response.id] = _Entry(
            StoredResponse(response, list(record.input_items), record.owner),
            self.options.instance_id,
            self.options.expires_at(self.options.clock()),
        )

    def _live(self, response_id: str, owner: str) -> _Entry | None:
        entry = self._entries.get(response_id)
        if entry is None or entry.record.owner != owner or self._expired(entry):
            return None
        return entry

    def _expired(self, entry: _Entry) -> bool:
        return entry.expires_at is not None and entry.expires_at <= self.options.clock()

    async def get(self, response_id: str, owner: str = "") -> StoredResponse | None:
        entry = self._live(response_id, owner)
        return None if entry is None else entry.record

    async def delete(self, response_id: str, owner: str = "") -> bool:
        if self._live(response_id, owner) is None:
            return False
        del self._entries[response_id]
        return True

    async def list_input_items(
        self, response_id: str, *, limit: int, after: str, descending: bool, owner: str = ""
    ) -> ItemPage | None:
        record = await self.get(response_id, owner)
        if record is None:
            return None
        return page_items(record.input_items, limit=limit, after=after, descending=descending)

    async def mark_interrupted(self) -> int:
        """Entries another (dead) store instance left running: nothing else shares this memory."""
        marked = 0
        for entry in self._entries.values():
            response = entry.record.response
            if response.status in RUNNING and entry.instance != self.options.instance_id:
                entry.record.response = pb.Response.FromString(interrupted(response.SerializeToString()))
                marked += 1
        return marked

    async def purge_expired(self) -> int:
        expired = [
            key
            for key, entry in self._entries.items()
            if self._expired(entry) and entry.record.response.status not in RUNNING
        ]
        for key in expired:
            del self._entries[key]
        return len(expired)

    async def request_cancel(self, response_id: str) -> bool:
        entry = self._entries.get(response_id)
        if entry is None or self._expired(entry) or entry.record.response.status not in RUNNING:
            return False
        self._cancels.deliver(response_id)
        return True

    def on_cancel(self, callback: Callable[[str], None]) -> None:
        self._cancels.add(callback)

    async def close(self) -> None:
        return None


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
