"""What only the SQLite store does: one file, one gateway, WAL, group commit off the event loop."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path

import pytest

from antwort_grpc import pb
from antwort_grpc.providers.base import TurnRequest
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text, Turn
from antwort_grpc.storage.migrations import SQLITE
from antwort_grpc.storage.sqlite import SQLiteStore, StoreInUse
from tests.harness import function_tool, running_gateway, user
from tests.storage.processes import run_cli
from tests.storage.records import S, record


async def test_a_second_gateway_on_the_same_file_is_refused(tmp_path: Path) -> None:
    first = await SQLiteStore.open(tmp_path / "a.db")
    try:
        with pytest.raises(StoreInUse, match="PostgreSQL"):
            await SQLiteStore.open(tmp_path / "a.db")
    finally:
        await first.close()
    second = await SQLiteStore.open(tmp_path / "a.db")
    await second.close()


async def test_the_file_is_in_wal_mode_with_the_current_schema(tmp_path: Path) -> None:
    store = await SQLiteStore.open(tmp_path / "a.db")
    await store.save(record("resp_1"))
    try:
        conn = sqlite3.connect(tmp_path / "a.db")
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(SQLITE)
        assert conn.execute("SELECT count(*) FROM antwort_responses").fetchone()[0] == 1
        conn.close()
    finally:
        await store.close()


async def test_the_migrate_command_works_next_to_a_running_gateway(tmp_path: Path) -> None:
    path = tmp_path / "data" / "fresh.db"
    for _ in range(2):
        done = await run_cli("migrate", "--store", f"sqlite:///{path}")
        assert done.returncode == 0, done.stderr
        assert f"schema version {len(SQLITE)}" in done.stdout
    store = await SQLiteStore.open(path)
    try:
        done = await run_cli("migrate", "--store", f"sqlite:///{path}")
        assert done.returncode == 0, done.stderr
    finally:
        await store.close()


def _weather_turn(request: TurnRequest) -> Turn:
    """Ask for the weather first; answer once the client sent the tool's output."""
    if any(i.WhichOneof("kind") == "function_call_output" for i in request.items):
        return Turn([Text("It is sunny.")])
    return Turn([Call.of("get_weather", {"city": "Paris"})])


async def test_two_hundred_concurrent_conversations_finish_without_database_is_locked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    store = await SQLiteStore.open(tmp_path / "busy.db")
    provider = ScriptedProvider([_weather_turn], repeat=True)

    async def conversation(gw: object, n: int) -> tuple[str, str]:
        stub = gw.stub  # type: ignore[attr-defined]
        request = user(f"weather #{n}")
        request.tools.append(function_tool("get_weather", city="string"))
        request.stream = n % 2 == 0
        events = [m.event async for m in stub.CreateResponse(request)]
        paused = events[-1].requires_action.response
        assert paused.status == S.RESPONSE_STATUS_REQUIRES_ACTION
        follow = pb.CreateResponseRequest(previous_response_id=paused.id, stream=n % 2 == 1)
        follow.tools.append(function_tool("get_weather", city="string"))
        follow.input_items.items.append(
            pb.Item(
                function_call_output=pb.FunctionCallOutput(
                    call_id=paused.output[0].function_call.call_id, output='{"sky": "clear"}'
                )
            )
        )
        events = [m.event async for m in stub.CreateResponse(follow)]
        done = events[-1].completed.response
        assert done.status == S.RESPONSE_STATUS_COMPLETED
        return paused.id, done.id

    try:
        async with running_gateway(provider=provider, store=store) as gw:
            ids = await asyncio.gather(*(conversation(gw, n) for n in range(200)))
        for paused_id, done_id in ids:
            paused, done = await store.get(paused_id), await store.get(done_id)
            assert paused is not None and paused.response.status == S.RESPONSE_STATUS_REQUIRES_ACTION
            assert done is not None and done.response.status == S.RESPONSE_STATUS_COMPLETED
        saves = 2 * len(ids) * 2
        assert store.writer.commits < saves, "concurrent saves shared commits"
    finally:
        await store.close()
    problems = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [p for p in problems if "locked" in p or "saving failed" in p], problems
