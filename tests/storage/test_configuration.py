"""ANTWORT_STORE and the other storage settings, and the pieces under the SQLite store."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from antwort_grpc import pb
from antwort_grpc.config import GatewaySettings
from antwort_grpc.core import assemble
from antwort_grpc.storage.codec import RUNNING_SQL, decode_items, encode_items
from antwort_grpc.storage.factory import open_store, options_from, sqlite_path
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.storage.sqlite import SQLiteStore
from antwort_grpc.storage.sqlite_worker import SQLiteWorker
from tests.storage.records import message

DATA = Path("/data")


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("", DATA / "antwort.db"),
        ("sqlite:///var/lib/antwort/a.db", Path("/var/lib/antwort/a.db")),
        ("sqlite://relative/a.db", Path("relative/a.db")),
        ("postgresql://u@h:5432/db", None),
        ("postgres://u@h/db", None),
        ("memory", None),
    ],
)
def test_the_store_url_names_the_sqlite_file(url: str, path: Path | None) -> None:
    assert sqlite_path(url, DATA) == path


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///"])
def test_a_sqlite_url_without_a_file_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="names no file"):
        sqlite_path(url, DATA)


async def test_an_unknown_store_kind_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="memory, sqlite"):
        await open_store("mysql://h/db", DATA)


async def test_memory_is_a_store_of_its_own() -> None:
    assert isinstance(await open_store("memory", DATA), MemoryStore)


async def test_no_store_configured_means_a_sqlite_file_in_the_data_directory(tmp_path: Path) -> None:
    data_dir = tmp_path / "var"
    store = await open_store("", data_dir)
    assert isinstance(store, SQLiteStore)
    try:
        assert store.path == data_dir / "antwort.db" and store.path.exists()
    finally:
        await store.close()


def test_retention_and_upkeep_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTWORT_RESPONSE_TTL_SECONDS", "86400")
    monkeypatch.setenv("ANTWORT_STORE_MAINTENANCE_SECONDS", "2.5")
    options = options_from(GatewaySettings())
    assert options.ttl_seconds == 86400 and options.maintenance_interval == 2.5
    monkeypatch.delenv("ANTWORT_RESPONSE_TTL_SECONDS")
    assert options_from(GatewaySettings()).ttl_seconds is None, "kept forever unless configured"


async def test_the_gateway_opens_its_store_with_the_configured_ttl(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [[{"text": "hi"}]]}))
    settings = GatewaySettings(store=f"sqlite:///{tmp_path}/g.db", response_ttl_seconds=60, script=script)
    parts = await assemble(settings)
    try:
        assert isinstance(parts.store, SQLiteStore) and parts.store.options.ttl_seconds == 60
    finally:
        await parts.close()
    # Closing the parts closed the store: the file is free for the next process.
    store = await SQLiteStore.open(tmp_path / "g.db")
    await store.close()


def test_the_running_statuses_in_sql_are_queued_and_in_progress() -> None:
    S = pb.ResponseStatus
    assert f"({int(S.RESPONSE_STATUS_QUEUED)}, {int(S.RESPONSE_STATUS_IN_PROGRESS)})" == RUNNING_SQL


@given(st.lists(st.text(max_size=300), max_size=20))
def test_input_items_round_trip_through_their_column(texts: list[str]) -> None:
    items = [message(text) for text in texts]
    assert decode_items(encode_items(items)) == items


async def test_a_failing_write_in_a_group_commit_fails_alone(tmp_path: Path) -> None:
    writer = SQLiteWorker(tmp_path / "w.db", writer=True)
    await writer.start()
    try:
        await writer.run(lambda conn: conn.execute("CREATE TABLE t (n INTEGER PRIMARY KEY)"))

        def insert(n: int) -> Callable[[sqlite3.Connection], None]:
            def job(conn: sqlite3.Connection) -> None:
                conn.execute("INSERT INTO t VALUES (?)", (n,))
                if n == 7:
                    raise RuntimeError("job 7 fails after writing")

            return job

        results = await asyncio.gather(*(writer.run(insert(n)) for n in range(50)), return_exceptions=True)
        failures = [n for n, result in enumerate(results) if isinstance(result, BaseException)]
        assert failures == [7]
        rows = await writer.run(lambda conn: [r[0] for r in conn.execute("SELECT n FROM t ORDER BY n")])
        assert rows == [n for n in range(50) if n != 7], "its write was rolled back, the others committed"
        assert writer.commits < 50, "the jobs shared commits"
    finally:
        await writer.close()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        await writer.run(lambda conn: None)
