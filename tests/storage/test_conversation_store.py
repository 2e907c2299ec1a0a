"""The conversation store contract, the same for memory, a SQLite file and a PostgreSQL database:
objects and ordered items, owner scoping, cursor paging, and appends that race each other."""

from __future__ import annotations

import asyncio
from typing import Any

from antwort_grpc import pb
from antwort_grpc.storage.conversations import Entry
from tests.storage.conftest import Backend
from tests.storage.records import record, texts


def said(text: str, item_id: str) -> pb.Item:
    part = pb.ContentPart(input_text=pb.InputText(text=text))
    return pb.Item(id=item_id, message=pb.Message(role=pb.Role.ROLE_USER, content=[part]))


def conversation(conversation_id: str, **metadata: str) -> pb.Conversation:
    made = pb.Conversation(id=conversation_id, metadata=metadata)
    made.created_at.FromSeconds(1_800_000_000)
    return made


async def test_a_conversation_reads_back_with_its_items_in_order(store: Any) -> None:
    kept = store.conversations
    await kept.create(conversation("conv_1", topic="trip"), [said("one", "m1"), said("two", "m2")], "alice")
    assert await kept.get("conv_1", "alice") == conversation("conv_1", topic="trip")
    assert await kept.append("conv_1", [Entry(said("three", "m3")), Entry(said("four", "m4"), True)], "alice")
    entries = await kept.entries("conv_1", "alice")
    assert [e.item.id for e in entries] == ["m1", "m2", "m3", "m4"]
    assert [e.from_model for e in entries] == [False, False, False, True]
    assert texts([e.item for e in entries]) == ["one", "two", "three", "four"]
    updated = await kept.update("conv_1", {"topic": "moved"}, "alice")
    assert updated is not None and dict(updated.metadata) == {"topic": "moved"}
    got = await kept.get("conv_1", "alice")
    assert got is not None and dict(got.metadata) == {"topic": "moved"}


async def test_items_are_paged_by_cursor_both_ways(store: Any) -> None:
    kept = store.conversations
    await kept.create(conversation("conv_1"), [said(str(n), f"m{n}") for n in range(5)], "")
    first = await kept.list_items("conv_1", limit=2, after="", descending=False, owner="")
    assert [i.id for i in first.items] == ["m0", "m1"] and first.has_more
    second = await kept.list_items("conv_1", limit=2, after="m1", descending=False, owner="")
    assert [i.id for i in second.items] == ["m2", "m3"] and second.has_more
    last = await kept.list_items("conv_1", limit=2, after="m3", descending=False, owner="")
    assert [i.id for i in last.items] == ["m4"] and not last.has_more
    newest = await kept.list_items("conv_1", limit=3, after="", descending=True, owner="")
    assert [i.id for i in newest.items] == ["m4", "m3", "m2"] and newest.has_more
    older = await kept.list_items("conv_1", limit=3, after="m2", descending=True, owner="")
    assert [i.id for i in older.items] == ["m1", "m0"] and not older.has_more
    unknown = await kept.list_items("conv_1", limit=3, after="m_nowhere", descending=False, owner="")
    assert unknown.items == [] and not unknown.has_more


async def test_an_item_is_read_and_deleted_by_id(store: Any) -> None:
    kept = store.conversations
    await kept.create(conversation("conv_1"), [said("one", "m1"), said("two", "m2")], "")
    item = await kept.get_item("conv_1", "m2", "")
    assert item is not None and texts([item]) == ["two"]
    assert await kept.delete_item("conv_1", "m1", "")
    assert not await kept.delete_item("conv_1", "m1", "")
    assert await kept.get_item("conv_1", "m1", "") is None
    assert [e.item.id for e in await kept.entries("conv_1", "")] == ["m2"]


async def test_another_owners_conversation_is_as_absent_as_an_unknown_one(store: Any) -> None:
    kept = store.conversations
    await kept.create(conversation("conv_1"), [said("secret", "m1")], "alice")
    for conversation_id in ("conv_1", "conv_unknown"):
        assert await kept.get(conversation_id, "bob") is None
        assert await kept.update(conversation_id, {"k": "v"}, "bob") is None
        assert await kept.entries(conversation_id, "bob") is None
        assert await kept.list_items(conversation_id, limit=10, after="", descending=False, owner="bob") is None
        assert await kept.get_item(conversation_id, "m1", "bob") is None
        assert not await kept.delete_item(conversation_id, "m1", "bob")
        assert not await kept.append(conversation_id, [Entry(said("x", "m9"))], "bob")
        assert not await kept.delete(conversation_id, "bob")
    # Nothing bob did reached alice's conversation.
    assert [e.item.id for e in await kept.entries("conv_1", "alice")] == ["m1"]


async def test_a_deleted_conversation_takes_its_items_with_it(store: Any) -> None:
    kept = store.conversations
    await kept.create(conversation("conv_1"), [said("one", "m1")], "")
    assert await kept.delete("conv_1", "")
    assert await kept.get("conv_1", "") is None and await kept.entries("conv_1", "") is None
    assert not await kept.append("conv_1", [Entry(said("late", "m2"))], "")
    # The same id again starts empty (no items left behind).
    await kept.create(conversation("conv_1"), [], "")
    assert await kept.entries("conv_1", "") == []


async def test_appends_at_the_same_time_keep_every_block_whole(store: Any) -> None:
    kept = store.conversations
    await kept.create(conversation("conv_1"), [said("start", "m0")], "")
    blocks = [[Entry(said(f"{n}-{k}", f"m{n}_{k}")) for k in range(3)] for n in range(12)]
    results = await asyncio.gather(*(kept.append("conv_1", block, "") for block in blocks))
    assert all(results)
    ids = [e.item.id for e in await kept.entries("conv_1", "")]
    assert ids[0] == "m0" and len(ids) == 1 + 12 * 3
    for start in range(1, len(ids), 3):
        block = ids[start : start + 3]
        prefix = block[0].rsplit("_", 1)[0]
        assert block == [f"{prefix}_{k}" for k in range(3)], ids


async def test_a_responses_final_save_and_its_append_are_one_write_and_racing_ones_keep_every_block(
    store: Any,
) -> None:
    kept = store.conversations
    await kept.create(conversation("conv_1"), [said("start", "m0")], "alice")
    saved = [record(f"resp_{n}", inputs=(f"{n}?",), outputs=(f"{n}!",), owner="alice") for n in range(8)]
    blocks = [[Entry(r.input_items[0]), Entry(r.response.output[0], True)] for r in saved]
    appended = await asyncio.gather(
        *(store.save_in_conversation(r, "conv_1", block) for r, block in zip(saved, blocks, strict=True))
    )
    assert all(appended)
    entries = await kept.entries("conv_1", "alice")
    said_texts = texts([e.item for e in entries])
    assert said_texts[0] == "start" and len(said_texts) == 1 + 2 * len(saved)
    for start in range(1, len(said_texts), 2):
        n = said_texts[start].rstrip("?")
        assert said_texts[start : start + 2] == [f"{n}?", f"{n}!"], said_texts
    assert [e.from_model for e in entries[1:3]] == [False, True]
    for r in saved:
        got = await store.get(r.response.id, "alice")
        assert got is not None and got.response == r.response
    # Another owner's conversation is not there: nothing appended, the response saved all the same.
    other = record("resp_bob", owner="bob")
    assert not await store.save_in_conversation(other, "conv_1", [Entry(other.input_items[0])])
    assert await store.get("resp_bob", "bob") is not None
    assert len(await kept.entries("conv_1", "alice")) == len(entries)


async def test_a_conversation_outlives_its_store_and_is_seen_by_another(backend: Backend) -> None:
    first = await backend.open()
    await first.conversations.create(conversation("conv_1"), [said("one", "m1")], "alice")
    if backend.kind == "sqlite":
        await backend.close(first)  # one gateway per file: reopened, as after a restart
    second = await backend.open()
    assert await second.conversations.append("conv_1", [Entry(said("two", "m2"))], "alice")
    assert [e.item.id for e in await second.conversations.entries("conv_1", "alice")] == ["m1", "m2"]
    # What an item reference reads on another replica (or after a restart) comes from the store.
    found = await second.conversations.find_items(["m1", "m2"], "alice")
    assert texts([found["m1"], found["m2"]]) == ["one", "two"]


async def test_an_item_is_found_by_id_in_any_of_the_owners_conversations_and_only_theirs(store: Any) -> None:
    kept = store.conversations
    await kept.create(conversation("conv_b"), [said("one", "m1"), said("in b", "shared")], "alice")
    await kept.create(conversation("conv_a"), [said("in a", "shared")], "alice")
    await kept.create(conversation("conv_c"), [said("bob's", "m_bob")], "bob")
    assert await kept.append("conv_b", [Entry(said("later", "m2"), True)], "alice")
    found = await kept.find_items(["m1", "shared", "m2", "m_bob", "m_nowhere"], "alice")
    assert sorted(found) == ["m1", "m2", "shared"]
    assert texts([found["m1"], found["m2"]]) == ["one", "later"]
    # An id two conversations hold: the one preferred (a create's own), else the least id.
    assert texts([found["shared"]]) == ["in a"]
    preferred = await kept.find_items(["shared"], "alice", prefer="conv_b")
    assert texts([preferred["shared"]]) == ["in b"]
    # Another owner's item is missing exactly as an unknown one; theirs to find.
    assert await kept.find_items(["m_bob"], "alice") == {}
    assert await kept.find_items(["m_bob"], "alice", prefer="conv_c") == {}
    assert texts([(await kept.find_items(["m_bob"], "bob"))["m_bob"]]) == ["bob's"]
    # Deleted items and conversations are found no more.
    assert await kept.delete_item("conv_b", "m1", "alice")
    assert await kept.delete("conv_a", "alice")
    found = await kept.find_items(["m1", "shared"], "alice")
    assert list(found) == ["shared"] and texts([found["shared"]]) == ["in b"]
