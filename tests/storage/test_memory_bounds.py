"""The memory store is bounded: past its count or byte bound the oldest finished responses are
evicted, never one that is still running."""

from __future__ import annotations

import json
import os
from pathlib import Path

import grpc
import pytest

from antwort_grpc import pb
from antwort_grpc.config import GatewaySettings
from antwort_grpc.core import assemble
from antwort_grpc.providers.base import TurnRequest
from antwort_grpc.providers.scripted import ScriptedProvider, Text, Turn
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.storage.options import StoreOptions
from tests.harness import GatewayClient, kind, running_gateway, user

S = pb.ResponseStatus


async def readable(gw: GatewayClient, response_id: str) -> bool:
    try:
        await gw.stub.GetResponse(pb.GetResponseRequest(response_id=response_id))
    except grpc.aio.AioRpcError as err:
        assert err.code() == grpc.StatusCode.NOT_FOUND
        return False
    return True


async def test_oldest_finished_responses_are_evicted_past_the_count() -> None:
    store = MemoryStore(StoreOptions(memory_max_responses=3))
    async with running_gateway(provider=ScriptedProvider([[Text("done")]], repeat=True), store=store) as gw:
        ids = [(await gw.create(user(f"question {n}"))).id for n in range(5)]
        assert [await readable(gw, i) for i in ids] == [False, False, True, True, True]
        # A continuation of an evicted response is NOT_FOUND like any unknown id.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await gw.create(pb.CreateResponseRequest(input_text="more", previous_response_id=ids[0]))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_oldest_finished_responses_are_evicted_past_the_byte_bound() -> None:
    store = MemoryStore(StoreOptions(memory_max_bytes=350_000))
    async with running_gateway(provider=ScriptedProvider([[Text("done")]], repeat=True), store=store) as gw:
        ids = [(await gw.create(user("x" * 100_000))).id for _ in range(5)]
        kept = [await readable(gw, i) for i in ids]
    assert kept == [False, False, True, True, True]
    assert store.database.size <= 350_000


def _slow_when_asked_to_take_time(turn: TurnRequest) -> Turn:
    asked = turn.items[-1].message.content[0].input_text.text
    return Turn([Text("slow")], delay=60) if asked == "take your time" else Turn([Text("quick")])


async def test_a_running_response_is_never_evicted() -> None:
    store = MemoryStore(StoreOptions(memory_max_responses=2))
    provider = ScriptedProvider([_slow_when_asked_to_take_time], repeat=True)
    async with running_gateway(provider=provider, store=store) as gw:
        request = user("take your time")
        request.stream = True
        stream = aiter(gw.stub.CreateResponse(request))
        created = (await anext(stream)).event
        assert kind(created) == "created"
        running_id = created.created.response.id
        finished = [(await gw.create(user(f"quick {n}"))).id for n in range(4)]
        record = await store.get(running_id)
        assert record is not None and record.response.status == S.RESPONSE_STATUS_IN_PROGRESS
        assert [await readable(gw, i) for i in finished] == [False, False, False, True]
        await gw.stub.CancelResponse(pb.CancelResponseRequest(response_id=running_id))
        events = [message.event async for message in stream]
        assert kind(events[-1]) == "cancelled"
        # Finished now, it is the oldest: the next save evicts it.
        await gw.create(user("one more"))
        assert not await readable(gw, running_id)


async def test_the_bounds_are_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(os.environ, "ANTWORT_MEMORY_MAX_RESPONSES", "7")
    monkeypatch.setitem(os.environ, "ANTWORT_MEMORY_MAX_BYTES", "1000000")
    assert (StoreOptions().memory_max_responses, StoreOptions().memory_max_bytes) == (10_000, 256 * 1024 * 1024)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [[{"text": "hi"}]]}))
    parts = await assemble(GatewaySettings(store="memory", script=script))
    try:
        assert isinstance(parts.store, MemoryStore)
        assert (parts.store.options.memory_max_responses, parts.store.options.memory_max_bytes) == (7, 1_000_000)
    finally:
        await parts.close()
