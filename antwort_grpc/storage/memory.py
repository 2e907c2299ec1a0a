"""An in-process store: for tests and for a gateway that needs no durability.

Bounded: past `StoreOptions.memory_max_responses` responses or `memory_max_bytes` bytes, the
oldest finished responses (by first save) are evicted; running ones never are."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from antwort_grpc import pb
from antwort_grpc.storage.base import RUNNING, ItemPage, StoredResponse
from antwort_grpc.storage.codec import find_item, indexed_ids, mark_interrupted, page_items
from antwort_grpc.storage.conversations import Entry, MemoryConversations, MemoryConversationTables
from antwort_grpc.storage.maintenance import CancelCallbacks
from antwort_grpc.storage.options import StoreOptions
from antwort_grpc.storage.runlog_memory import MemoryRunLog, RunTables


@dataclass(slots=True)
class _Entry:
    record: StoredResponse
    instance: str
    expires_at: float | None
    # Serialized size of the response and its input items.
    size: int = 0


@dataclass(slots=True)
class MemoryDatabase:
    """What MemoryStores keep. Tests share one between stores to model a database that outlives
    the process using it (reopen after close) or that several gateways use."""

    # In the order of first save: the oldest first, for eviction.
    entries: dict[str, _Entry] = field(default_factory=dict)
    # The sum of the entries' sizes.
    size: int = 0
    # Background runs: event logs, checkpoints, leases, idempotency keys (runlog_memory.py).
    runs: RunTables = field(default_factory=RunTables)
    # Conversations and their items (storage/conversations.py).
    conversations: MemoryConversationTables = field(default_factory=MemoryConversationTables)
    # (owner, item id) -> the ended responses that hold the item, the latest last. Built at the
    # first lookup and kept from then on: a process whose clients never refer to items pays nothing.
    items: dict[tuple[str, str], dict[str, None]] | None = None

    def put(self, key: str, entry: _Entry, max_entries: int, max_bytes: int) -> None:
        """Keep `entry` under `key`, then evict down to the bounds (one call per save)."""
        old = self.entries.get(key)
        self.size += entry.size - (old.size if old is not None else 0)
        self.entries[key] = entry
        if self.items is not None:
            self._index(key, entry)
        if len(self.entries) > max_entries or self.size > max_bytes:
            self._evict(max_entries, max_bytes)

    def remove(self, key: str) -> None:
        entry = self.entries.pop(key)
        self.size -= entry.size
        if self.items is None:
            return
        for item_id in indexed_ids(entry.record):
            holders = self.items.get((entry.record.owner, item_id))
            if holders is not None:
                holders.pop(key, None)
                if not holders:
                    del self.items[(entry.record.owner, item_id)]

    def item_index(self) -> dict[tuple[str, str], dict[str, None]]:
        if self.items is None:
            self.items = {}
            for key, entry in self.entries.items():
                self._index(key, entry)
        return self.items

    def _index(self, key: str, entry: _Entry) -> None:
        assert self.items is not None
        for item_id in indexed_ids(entry.record):
            holders = self.items.setdefault((entry.record.owner, item_id), {})
            holders.pop(key, None)
            holders[key] = None

    def _evict(self, max_entries: int, max_bytes: int) -> None:
        """Drop the oldest finished entries until both bounds hold (or only running ones are left)."""
        over_count, over_bytes = len(self.entries) - max_entries, self.size - max_bytes
        victims = []
        for key, entry in self.entries.items():
            if over_count <= 0 and over_bytes <= 0:
                break
            if entry.record.response.status in RUNNING:
                continue
            victims.append(key)
            over_count -= 1
            over_bytes -= entry.size
        for key in victims:
            self.remove(key)


class MemoryStore:
    def __init__(self, options: StoreOptions | None = None, database: MemoryDatabase | None = None) -> None:
        self.options = options or StoreOptions()
        self.database = database or MemoryDatabase()
        self._cancels = CancelCallbacks()
        self.runlog = MemoryRunLog(self.database.runs, self.options)
        self.conversations = MemoryConversations(self.database.conversations)

    @property
    def _entries(self) -> dict[str, _Entry]:
        return self.database.entries

    async def save(self, record: StoredResponse) -> None:
        old = self._entries.get(record.response.id)
        if old is not None and old.record.response.status not in RUNNING and record.response.status in RUNNING:
            return
        copy = _copy(record)
        size = copy.response.ByteSize() + sum(map(_byte_size, copy.input_items))
        entry = _Entry(copy, self.options.instance_id, self.options.expires_at(self.options.clock()), size)
        self.database.put(record.response.id, entry, self.options.memory_max_responses, self.options.memory_max_bytes)

    async def save_in_conversation(
        self, record: StoredResponse, conversation_id: str, entries: Sequence[Entry]
    ) -> bool:
        # Neither awaits anything: nothing else runs on the event loop between the two.
        appended = await self.conversations.append(conversation_id, entries, record.owner)
        await self.save(record)
        return appended

    def _live(self, response_id: str, owner: str) -> _Entry | None:
        entry = self._entries.get(response_id)
        if entry is None or entry.record.owner != owner or self._expired(entry):
            return None
        return entry

    def _expired(self, entry: _Entry) -> bool:
        return entry.expires_at is not None and entry.expires_at <= self.options.clock()

    async def get(self, response_id: str, owner: str = "") -> StoredResponse | None:
        entry = self._live(response_id, owner)
        # A copy, as a database would give: callers may change what they read.
        return None if entry is None else _copy(entry.record)

    async def delete(self, response_id: str, owner: str = "") -> bool:
        if self._live(response_id, owner) is None:
            return False
        self.database.remove(response_id)
        return True

    async def list_input_items(
        self, response_id: str, *, limit: int, after: str, descending: bool, owner: str = ""
    ) -> ItemPage | None:
        entry = self._live(response_id, owner)
        if entry is None:
            return None
        return page_items(entry.record.input_items, limit=limit, after=after, descending=descending)

    async def find_items(self, item_ids: Sequence[str], owner: str = "") -> dict[str, pb.Item]:
        found: dict[str, pb.Item] = {}
        index = self.database.item_index()
        for item_id in item_ids:
            for response_id in reversed(index.get((owner, item_id), {})):
                entry = self._live(response_id, owner)
                item = find_item(entry.record, item_id) if entry is not None else None
                if item is not None:
                    found[item_id] = pb.Item()
                    found[item_id].CopyFrom(item)
                    break
        return found

    async def purge_expired(self) -> int:
        expired = [
            key
            for key, entry in self._entries.items()
            if self._expired(entry) and entry.record.response.status not in RUNNING
        ]
        for key in expired:
            self.database.remove(key)
        return len(expired)

    async def request_cancel(self, response_id: str, owner: str = "") -> bool:
        entry = self._live(response_id, owner)
        if entry is None or entry.record.response.status not in RUNNING:
            return False
        self._cancels.deliver(response_id)
        return True

    def on_cancel(self, callback: Callable[[str], object]) -> Callable[[], None]:
        return self._cancels.add(callback)

    async def close(self) -> None:
        for entry in self._entries.values():
            if (
                entry.instance == self.options.instance_id
                and entry.record.response.status in RUNNING
                and not self.database.runs.resumable(entry.record.response.id)
            ):
                mark_interrupted(entry.record.response)


# The unbound method: a generator expression would be one more Python frame per save.
_byte_size = pb.Item.ByteSize


def _copy(record: StoredResponse) -> StoredResponse:
    response = pb.Response()
    response.CopyFrom(record.response)
    items = []
    for item in record.input_items:
        copy = pb.Item()
        copy.CopyFrom(item)
        items.append(copy)
    return StoredResponse(response, items, record.owner)
