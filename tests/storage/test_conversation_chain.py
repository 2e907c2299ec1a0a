"""previous_response_id: the context rebuilt from a chain of stored responses, on every store."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from antwort_grpc.engine.history import load_history
from antwort_grpc.errors import RequestError
from tests.storage.records import S, record, texts


async def test_the_chain_rebuilds_earlier_input_then_output_oldest_first(store: Any) -> None:
    await store.save(record("resp_1", inputs=("q1",), outputs=("a1",)))
    await store.save(record("resp_2", inputs=("q2",), outputs=("a2",), previous="resp_1"))
    await store.save(record("resp_3", inputs=("q3",), outputs=("a3",), previous="resp_2"))
    items = (await load_history(store, "resp_3", owner="", max_depth=100)).items
    assert texts(items) == ["q1", "a1", "q2", "a2", "q3", "a3"]


async def test_a_missing_previous_response_is_not_found(store: Any) -> None:
    with pytest.raises(RequestError) as info:
        await load_history(store, "resp_gone", owner="", max_depth=100)
    assert info.value.code == grpc.StatusCode.NOT_FOUND
    assert "resp_gone" in info.value.message


async def test_a_missing_link_earlier_in_the_chain_is_not_found(store: Any) -> None:
    await store.save(record("resp_2", previous="resp_deleted"))
    with pytest.raises(RequestError) as info:
        await load_history(store, "resp_2", owner="", max_depth=100)
    assert info.value.code == grpc.StatusCode.NOT_FOUND
    assert "resp_deleted" in info.value.message


async def test_another_owners_response_is_not_found(store: Any) -> None:
    await store.save(record("resp_1", owner="alice"))
    with pytest.raises(RequestError) as info:
        await load_history(store, "resp_1", owner="bob", max_depth=100)
    assert info.value.code == grpc.StatusCode.NOT_FOUND


async def test_a_cycle_in_the_chain_is_refused_not_followed_forever(store: Any) -> None:
    await store.save(record("resp_a", previous="resp_c"))
    await store.save(record("resp_b", previous="resp_a"))
    await store.save(record("resp_c", previous="resp_b"))
    with pytest.raises(RequestError) as info:
        await load_history(store, "resp_c", owner="", max_depth=100)
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "cycle" in info.value.message


async def test_a_chain_longer_than_the_depth_limit_is_refused(store: Any) -> None:
    previous = ""
    for n in range(5):
        await store.save(record(f"resp_{n}", inputs=(f"q{n}",), outputs=(f"a{n}",), previous=previous))
        previous = f"resp_{n}"
    assert len((await load_history(store, "resp_4", owner="", max_depth=5)).items) == 10
    with pytest.raises(RequestError) as info:
        await load_history(store, "resp_4", owner="", max_depth=4)
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "longer than 4" in info.value.message


async def test_a_response_still_in_progress_cannot_be_continued_yet(store: Any) -> None:
    await store.save(record("resp_1", status=S.RESPONSE_STATUS_IN_PROGRESS))
    with pytest.raises(RequestError) as info:
        await load_history(store, "resp_1", owner="", max_depth=100)
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
