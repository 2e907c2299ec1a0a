"""The ResponseStore contract, the same for memory, a SQLite file and a PostgreSQL database."""

from __future__ import annotations

from typing import Any

from antwort_grpc import pb
from antwort_grpc.storage.base import INTERRUPTED, CancelSignals, Closable, ResponseStore
from tests.storage.conftest import Backend
from tests.storage.records import S, message, record, texts


async def test_a_saved_response_reads_back_whole_with_its_input_items(store: Any) -> None:
    saved = record("resp_1", inputs=("one", "two"), outputs=("answer",), previous="resp_0")
    saved.response.usage.input_tokens = 12
    saved.response.metadata["k"] = "v"
    await store.save(saved)
    got = await store.get("resp_1")
    assert got is not None
    assert got.response == saved.response
    assert got.input_items == saved.input_items
    assert texts(got.input_items) == ["one", "two"]


async def test_an_unknown_id_reads_as_none(store: Any) -> None:
    assert await store.get("resp_missing") is None
    assert await store.delete("resp_missing") is False
    assert await store.list_input_items("resp_missing", limit=10, after="", descending=False) is None


async def test_saving_again_replaces_the_running_snapshot_with_the_final_response(store: Any) -> None:
    await store.save(record("resp_1", status=S.RESPONSE_STATUS_IN_PROGRESS, outputs=()))
    running = await store.get("resp_1")
    assert running is not None and running.response.status == S.RESPONSE_STATUS_IN_PROGRESS
    await store.save(record("resp_1", status=S.RESPONSE_STATUS_REQUIRES_ACTION, outputs=("calling",)))
    ended = await store.get("resp_1")
    assert ended is not None and ended.response.status == S.RESPONSE_STATUS_REQUIRES_ACTION
    assert texts(list(ended.response.output)) == ["calling"]


async def test_a_late_in_progress_write_never_takes_an_ended_response_back(store: Any) -> None:
    await store.save(record("resp_1", status=S.RESPONSE_STATUS_CANCELLED, outputs=("partial",)))
    await store.save(record("resp_1", status=S.RESPONSE_STATUS_IN_PROGRESS, outputs=()))
    got = await store.get("resp_1")
    assert got is not None and got.response.status == S.RESPONSE_STATUS_CANCELLED
    # A final status may still replace another (a replica's own end wins over a sweep's verdict).
    await store.save(record("resp_1", status=S.RESPONSE_STATUS_COMPLETED))
    got = await store.get("resp_1")
    assert got is not None and got.response.status == S.RESPONSE_STATUS_COMPLETED


async def test_what_a_reader_changes_does_not_change_what_is_stored(store: Any) -> None:
    await store.save(record("resp_1"))
    first = await store.get("resp_1")
    assert first is not None
    first.response.status = S.RESPONSE_STATUS_FAILED
    first.input_items.clear()
    again = await store.get("resp_1")
    assert again is not None and again.response.status == S.RESPONSE_STATUS_COMPLETED and again.input_items


async def test_delete_removes_the_response_and_says_whether_it_existed(store: Any) -> None:
    await store.save(record("resp_1"))
    assert await store.delete("resp_1") is True
    assert await store.get("resp_1") is None
    assert await store.delete("resp_1") is False


async def test_each_response_records_its_owner_and_only_they_can_read_delete_list_or_cancel(store: Any) -> None:
    await store.save(record("resp_a", owner="alice"))
    await store.save(record("resp_r", owner="alice", status=S.RESPONSE_STATUS_IN_PROGRESS))
    got = await store.get("resp_a", "alice")
    assert got is not None and got.owner == "alice"
    assert await store.get("resp_a") is None
    assert await store.get("resp_a", "bob") is None
    assert await store.list_input_items("resp_a", limit=5, after="", descending=False, owner="bob") is None
    assert await store.delete("resp_a", "bob") is False
    assert await store.request_cancel("resp_r", "bob") is False
    assert await store.get("resp_a", "alice") is not None
    assert await store.delete("resp_a", "alice") is True


async def test_input_items_page_forward_and_backward_after_a_cursor(store: Any) -> None:
    saved = record("resp_1", inputs=())
    saved.input_items = [message(f"m{n}", item_id=f"item_{n}") for n in range(5)]
    await store.save(saved)

    async def page(limit: int, after: str = "", descending: bool = False) -> tuple[list[str], bool]:
        got = await store.list_input_items("resp_1", limit=limit, after=after, descending=descending)
        assert got is not None
        return [i.id for i in got.items], got.has_more

    assert await page(2) == (["item_0", "item_1"], True)
    assert await page(2, after="item_1") == (["item_2", "item_3"], True)
    assert await page(2, after="item_3") == (["item_4"], False)
    assert await page(10) == ([f"item_{n}" for n in range(5)], False)
    assert await page(2, descending=True) == (["item_4", "item_3"], True)
    assert await page(3, after="item_3", descending=True) == (["item_2", "item_1", "item_0"], False)
    assert await page(2, after="item_0") == (["item_1", "item_2"], True)
    assert await page(2, after="item_4") == ([], False)
    assert await page(2, after="not_an_item") == ([], False)


async def test_responses_expire_after_the_ttl_counted_from_their_last_save(backend: Backend) -> None:
    store = await backend.open(ttl_seconds=60.0)
    await store.save(record("resp_old"))
    backend.clock.advance(40)
    await store.save(record("resp_new"))
    await store.save(record("resp_running", status=S.RESPONSE_STATUS_IN_PROGRESS))
    backend.clock.advance(30)
    # Past its TTL a response is gone for readers at once, before any purge runs.
    assert await store.get("resp_old") is None
    assert await store.delete("resp_old") is False
    assert await store.get("resp_new") is not None
    assert await store.purge_expired() == 1
    backend.clock.advance(3600)
    # Running responses are never purged under the loop running them.
    assert await store.purge_expired() == 1
    assert await store.get("resp_new") is None


async def test_without_a_ttl_responses_are_kept(backend: Backend) -> None:
    store = await backend.open()
    await store.save(record("resp_1"))
    backend.clock.advance(10 * 365 * 86400)
    assert await store.get("resp_1") is not None
    assert await store.purge_expired() == 0


async def test_responses_outlive_the_store_that_saved_them(backend: Backend) -> None:
    first = await backend.open()
    for n in range(3):
        await first.save(record(f"resp_{n}", outputs=(f"answer {n}",)))
    await backend.close(first)
    second = await backend.open()
    for n in range(3):
        got = await second.get(f"resp_{n}")
        assert got is not None and texts(list(got.response.output)) == [f"answer {n}"]


async def test_what_a_closing_store_still_ran_is_marked_failed_interrupted(backend: Backend) -> None:
    first = await backend.open()
    running = record("resp_running", status=S.RESPONSE_STATUS_IN_PROGRESS, outputs=("half",))
    running.response.output[0].status = pb.ItemStatus.ITEM_STATUS_IN_PROGRESS
    await first.save(running)
    done = record("resp_done")
    await first.save(done)
    await backend.close(first)
    second = await backend.open()
    got = await second.get("resp_running")
    assert got is not None
    assert got.response.status == S.RESPONSE_STATUS_FAILED
    assert got.response.error.code == INTERRUPTED
    assert got.response.output[0].status == pb.ItemStatus.ITEM_STATUS_INCOMPLETE
    assert texts(list(got.response.output)) == ["half"], "the output it had is kept"
    assert got.response.HasField("completed_at")
    intact = await second.get("resp_done")
    assert intact is not None and intact.response == done.response


async def test_a_cancel_request_reaches_the_subscriber_only_for_a_running_response(store: Any) -> None:
    heard: list[str] = []
    unsubscribe = store.on_cancel(heard.append)
    await store.save(record("resp_running", status=S.RESPONSE_STATUS_IN_PROGRESS))
    await store.save(record("resp_done"))
    assert await store.request_cancel("resp_running") is True
    await _delivered(store, heard, ["resp_running"])
    assert await store.request_cancel("resp_done") is False
    assert await store.request_cancel("resp_missing") is False
    unsubscribe()
    assert await store.request_cancel("resp_running") is True
    assert heard == ["resp_running"], "no delivery after unsubscribing"


async def test_every_store_is_a_response_store_with_cancel_signals_and_close(store: Any) -> None:
    assert isinstance(store, CancelSignals) and isinstance(store, Closable)
    assert all(callable(getattr(store, name)) for name in ResponseStore.__dict__ if not name.startswith("_"))


async def _delivered(store: Any, heard: list[str], expected: list[str]) -> None:
    """PostgreSQL delivers through NOTIFY, the others at once."""
    import asyncio

    if heard != expected:
        done = asyncio.Event()
        store.on_cancel(lambda _id: done.set())
        async with asyncio.timeout(5):
            await done.wait()
    assert heard == expected


# -- items by id (item references) ------------------------------------------------------------


async def test_an_ended_responses_input_and_output_items_are_found_by_id(store: Any) -> None:
    saved = record("resp_1", inputs=("question",), outputs=("answer",), owner="acme")
    await store.save(saved)
    asked, answered = saved.input_items[0], saved.response.output[0]
    found = await store.find_items([asked.id, answered.id, "msg_nowhere"], "acme")
    assert found == {asked.id: asked, answered.id: answered}
    # What a reader changes is not what is stored.
    found[asked.id].message.content[0].input_text.text = "changed"
    assert texts([(await store.find_items([asked.id], "acme"))[asked.id]]) == ["question"]


async def test_another_owners_item_is_not_found_as_if_it_did_not_exist(store: Any) -> None:
    saved = record("resp_1", owner="acme")
    await store.save(saved)
    assert await store.find_items([saved.response.output[0].id], "globex") == {}


async def test_an_item_is_found_once_its_response_has_ended_and_no_longer_once_deleted(backend: Backend) -> None:
    store = await backend.open(ttl_seconds=60.0)
    running = record("resp_1", status=S.RESPONSE_STATUS_IN_PROGRESS)
    await store.save(running)
    item_id = running.input_items[0].id
    assert await store.find_items([item_id]) == {}
    ended = record("resp_1", status=S.RESPONSE_STATUS_REQUIRES_ACTION)
    ended.input_items[:] = running.input_items
    await store.save(ended)
    assert list(await store.find_items([item_id])) == [item_id]
    assert await store.delete("resp_1")
    assert await store.find_items([item_id]) == {}
    await store.save(ended)
    backend.clock.advance(61)
    assert await store.find_items([item_id]) == {}, "expired"


async def test_an_item_several_responses_hold_is_found_while_any_of_them_is_kept(store: Any) -> None:
    shared = message("said twice", item_id="msg_shared")
    first, second = record("resp_1"), record("resp_2")
    first.input_items[:] = [shared]
    second.input_items[:] = [shared]
    second.response.created_at.FromSeconds(1_800_000_100)
    await store.save(first)
    await store.save(second)
    assert texts([(await store.find_items(["msg_shared"]))["msg_shared"]]) == ["said twice"]
    assert await store.delete("resp_2")
    assert texts([(await store.find_items(["msg_shared"]))["msg_shared"]]) == ["said twice"]


async def test_once_an_item_was_looked_up_a_reopened_store_still_finds_what_ends_later(backend: Backend) -> None:
    # SQLite and memory index items only from the first lookup on (what was stored before is
    # indexed then): the database remembers that it does.
    first = await backend.open()
    before = record("resp_1")
    await first.save(before)
    assert list(await first.find_items([before.input_items[0].id])) == [before.input_items[0].id]
    await backend.close(first)
    second = await backend.open()
    later = record("resp_2")
    await second.save(later)
    assert list(await second.find_items([later.response.output[0].id])) == [later.response.output[0].id]
    assert list(await second.find_items([before.input_items[0].id])) == [before.input_items[0].id]
