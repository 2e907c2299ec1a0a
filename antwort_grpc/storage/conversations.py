"""Conversations kept by the gateway: a conversation object and its items, in order.

Every store offers them as its `conversations` attribute (a `ConversationStore`). Items have a
position in their conversation; an append takes the next positions in one transaction with
the conversation's row locked (PostgreSQL) or in the one writer (SQLite, memory), so two
responses that end at once in the same conversation both keep their items, each block whole,
in the order the appends committed. Every operation takes the owner: another owner's
conversation is answered as one that does not exist.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, runtime_checkable

from google.protobuf.message import Message

from antwort_grpc import pb
from antwort_grpc.storage.base import ItemPage, StoredResponse

M = TypeVar("M", bound=Message)


@dataclass(slots=True)
class Entry:
    """An item of a conversation; `from_model`: a response's output (so a continuation may run
    the calls it holds, as the model made them)."""

    item: pb.Item
    from_model: bool = False


@runtime_checkable
class ConversationStore(Protocol):
    async def create(self, conversation: pb.Conversation, items: Sequence[pb.Item], owner: str) -> None: ...

    async def get(self, conversation_id: str, owner: str) -> pb.Conversation | None: ...

    async def update(self, conversation_id: str, metadata: Mapping[str, str], owner: str) -> pb.Conversation | None:
        """Replace the metadata; the conversation as it is now (None: no such conversation)."""
        ...

    async def delete(self, conversation_id: str, owner: str) -> bool: ...

    async def append(self, conversation_id: str, entries: Sequence[Entry], owner: str) -> bool:
        """Append after every item so far, all or nothing; False: no such conversation."""
        ...

    async def list_items(
        self, conversation_id: str, *, limit: int, after: str, descending: bool, owner: str
    ) -> ItemPage | None:
        """None when the conversation does not exist; an `after` not among its items: empty."""
        ...

    async def get_item(self, conversation_id: str, item_id: str, owner: str) -> pb.Item | None: ...

    async def delete_item(self, conversation_id: str, item_id: str, owner: str) -> bool: ...

    async def find_items(self, item_ids: Sequence[str], owner: str, prefer: str = "") -> dict[str, pb.Item]:
        """The items with these ids in any of `owner`'s conversations, by id (an id in none of
        them, or only in another owner's, is missing from the answer). An id several hold is
        taken from `prefer` (the conversation a create continues) when it holds it, else from
        the one with the least conversation id, at its first position there: the same answer
        in every store."""
        ...

    async def entries(self, conversation_id: str, owner: str) -> list[Entry] | None:
        """Every item, oldest first (None: no such conversation): a response's history."""
        ...


@runtime_checkable
class SavesInConversation(Protocol):
    """A response store whose conversations are in the same database: a response's final save
    and its conversation's append commit together, so a replica that dies between them leaves
    neither (the replica that takes the run over ends it and appends once) or both (the run
    ended: it is not run again)."""

    async def save_in_conversation(
        self, record: StoredResponse, conversation_id: str, entries: Sequence[Entry]
    ) -> bool:
        """Save `record` (as `save`) and append `entries` to the conversation (as `append`, owned
        by the record's owner) in one transaction. False: no such conversation (the response is
        saved all the same)."""
        ...


@dataclass(slots=True)
class _Kept:
    conversation: pb.Conversation
    owner: str
    entries: list[Entry] = field(default_factory=list)


@dataclass(slots=True)
class MemoryConversationTables:
    """What MemoryConversations keep; shared by the stores of one MemoryDatabase."""

    kept: dict[str, _Kept] = field(default_factory=dict)


class MemoryConversations:
    """Conversations in the process (the memory store's): appends are atomic on the event loop."""

    def __init__(self, tables: MemoryConversationTables) -> None:
        self.tables = tables

    def _find(self, conversation_id: str, owner: str) -> _Kept | None:
        kept = self.tables.kept.get(conversation_id)
        return kept if kept is not None and kept.owner == owner else None

    async def create(self, conversation: pb.Conversation, items: Sequence[pb.Item], owner: str) -> None:
        self.tables.kept[conversation.id] = _Kept(_copy(conversation), owner, [Entry(_copy(i)) for i in items])

    async def get(self, conversation_id: str, owner: str) -> pb.Conversation | None:
        kept = self._find(conversation_id, owner)
        return None if kept is None else _copy(kept.conversation)

    async def update(self, conversation_id: str, metadata: Mapping[str, str], owner: str) -> pb.Conversation | None:
        kept = self._find(conversation_id, owner)
        if kept is None:
            return None
        kept.conversation.metadata.clear()
        kept.conversation.metadata.update(metadata)
        return _copy(kept.conversation)

    async def delete(self, conversation_id: str, owner: str) -> bool:
        if self._find(conversation_id, owner) is None:
            return False
        del self.tables.kept[conversation_id]
        return True

    async def append(self, conversation_id: str, entries: Sequence[Entry], owner: str) -> bool:
        kept = self._find(conversation_id, owner)
        if kept is None:
            return False
        kept.entries += [Entry(_copy(e.item), e.from_model) for e in entries]
        return True

    async def list_items(
        self, conversation_id: str, *, limit: int, after: str, descending: bool, owner: str
    ) -> ItemPage | None:
        kept = self._find(conversation_id, owner)
        if kept is None:
            return None
        return page([e.item for e in kept.entries], limit=limit, after=after, descending=descending)

    async def get_item(self, conversation_id: str, item_id: str, owner: str) -> pb.Item | None:
        kept = self._find(conversation_id, owner)
        found = next((e.item for e in kept.entries if e.item.id == item_id), None) if kept else None
        return None if found is None else _copy(found)

    async def delete_item(self, conversation_id: str, item_id: str, owner: str) -> bool:
        kept = self._find(conversation_id, owner)
        if kept is None:
            return False
        for n, entry in enumerate(kept.entries):
            if entry.item.id == item_id:
                del kept.entries[n]
                return True
        return False

    async def find_items(self, item_ids: Sequence[str], owner: str, prefer: str = "") -> dict[str, pb.Item]:
        wanted = set(item_ids)
        mine = [kept for kept in self.tables.kept.values() if kept.owner == owner]
        mine.sort(key=lambda kept: (kept.conversation.id != prefer, kept.conversation.id))
        found: dict[str, pb.Item] = {}
        for kept in mine:
            for entry in kept.entries:
                if entry.item.id in wanted and entry.item.id not in found:
                    found[entry.item.id] = _copy(entry.item)
            if len(found) == len(wanted):
                break
        return found

    async def entries(self, conversation_id: str, owner: str) -> list[Entry] | None:
        kept = self._find(conversation_id, owner)
        return None if kept is None else [Entry(_copy(e.item), e.from_model) for e in kept.entries]


def page(items: list[pb.Item], *, limit: int, after: str, descending: bool) -> ItemPage:
    """A page of `items` (oldest first) after the item `after`, in the order asked."""
    ordered = list(reversed(items)) if descending else items
    start = 0
    if after:
        start = next((n + 1 for n, item in enumerate(ordered) if item.id == after), -1)
        if start < 0:
            return ItemPage([], False)
    return ItemPage([_copy(i) for i in ordered[start : start + limit]], start + limit < len(ordered))


def _copy(message: M) -> M:
    copy = type(message)()
    copy.CopyFrom(message)
    return copy
