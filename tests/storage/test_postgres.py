"""What only the PostgreSQL store does: replicas sharing one database see who is alive, carry
cancels to each other, and migrate once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from antwort_grpc.storage.base import INTERRUPTED
from antwort_grpc.storage.migrations import POSTGRES
from antwort_grpc.storage.options import StoreOptions
from antwort_grpc.storage.postgres import APPLICATION, PostgresStore, migrate_database
from tests.storage.processes import run_cli
from tests.storage.records import S, record


@pytest.fixture
async def admin(postgres_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(postgres_url)
    yield conn
    await conn.close()


async def replica(url: str, *, interval: float = 3600.0) -> PostgresStore:
    return await PostgresStore.open(url, StoreOptions(maintenance_interval=interval))


async def end_session(admin: asyncpg.Connection, store: PostgresStore) -> None:
    """What a replica's death looks like to the database: its session ends (and with it the
    lock). Waits until the server has ended it."""
    pids = await admin.fetch(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()",
        f"{APPLICATION} session",
    )
    session = store._session
    assert session is not None
    own = session.get_server_pid()
    assert own in [p["pid"] for p in pids]
    assert await admin.fetchval("SELECT pg_terminate_backend($1, 10000)", own)


async def test_a_live_replicas_running_responses_are_never_swept(postgres_url: str) -> None:
    a, b = await replica(postgres_url), await replica(postgres_url)
    try:
        await a.save(record("resp_long", status=S.RESPONSE_STATUS_IN_PROGRESS))
        assert await b.mark_interrupted() == 0
        got = await b.get("resp_long")
        assert got is not None and got.response.status == S.RESPONSE_STATUS_IN_PROGRESS
    finally:
        await b.close()
        await a.close()


async def test_a_replica_whose_session_ended_has_its_running_responses_marked_interrupted(
    postgres_url: str, admin: asyncpg.Connection
) -> None:
    a, b = await replica(postgres_url), await replica(postgres_url)
    try:
        await a.save(record("resp_running", status=S.RESPONSE_STATUS_IN_PROGRESS))
        await a.save(record("resp_done"))
        await end_session(admin, a)
        assert await b.mark_interrupted() == 1
        got = await b.get("resp_running")
        assert got is not None and got.response.status == S.RESPONSE_STATUS_FAILED
        assert got.response.error.code == INTERRUPTED
        done = await b.get("resp_done")
        assert done is not None and done.response.status == S.RESPONSE_STATUS_COMPLETED
        assert await b.mark_interrupted() == 0, "marked once"
    finally:
        await b.close()
        await a.close()


async def test_a_replica_starting_up_marks_what_a_dead_replica_left(
    postgres_url: str, admin: asyncpg.Connection
) -> None:
    dead = await replica(postgres_url)
    await dead.save(record("resp_orphan", status=S.RESPONSE_STATUS_IN_PROGRESS))
    await end_session(admin, dead)
    fresh = await replica(postgres_url)
    try:
        got = await fresh.get("resp_orphan")
        assert got is not None and got.response.error.code == INTERRUPTED
    finally:
        await fresh.close()
        await dead.pool.close()


async def test_a_replicas_own_late_final_save_wins_over_a_sweep(postgres_url: str, admin: asyncpg.Connection) -> None:
    """A replica that only lost its session (a network blip) finishes its responses: its final
    save replaces the sweep's interrupted verdict."""
    a, b = await replica(postgres_url), await replica(postgres_url)
    try:
        await a.save(record("resp_1", status=S.RESPONSE_STATUS_IN_PROGRESS))
        await end_session(admin, a)
        assert await b.mark_interrupted() == 1
        await a.save(record("resp_1", status=S.RESPONSE_STATUS_COMPLETED, outputs=("finished",)))
        got = await b.get("resp_1")
        assert got is not None and got.response.status == S.RESPONSE_STATUS_COMPLETED
    finally:
        await b.close()
        await a.close()


async def test_a_cancel_on_one_replica_reaches_the_replica_running_the_response(postgres_url: str) -> None:
    a, b = await replica(postgres_url), await replica(postgres_url)
    try:
        heard_a: asyncio.Queue[str] = asyncio.Queue()
        heard_b: list[str] = []
        a.on_cancel(heard_a.put_nowait)
        b.on_cancel(heard_b.append)
        await a.save(record("resp_on_a", status=S.RESPONSE_STATUS_IN_PROGRESS))
        assert await b.request_cancel("resp_on_a") is True
        async with asyncio.timeout(5):
            assert await heard_a.get() == "resp_on_a"
        assert heard_b == [], "only the replica running it is told"
    finally:
        await b.close()
        await a.close()


async def test_a_cancel_sent_while_the_runner_was_disconnected_arrives_when_it_reconnects(
    postgres_url: str, admin: asyncpg.Connection
) -> None:
    a = await replica(postgres_url, interval=0.05)
    b = await replica(postgres_url)
    try:
        heard: asyncio.Queue[str] = asyncio.Queue()
        a.on_cancel(heard.put_nowait)
        await a.save(record("resp_on_a", status=S.RESPONSE_STATUS_IN_PROGRESS))
        await end_session(admin, a)
        # The NOTIFY finds nobody listening; the flag stays set.
        assert await b.request_cancel("resp_on_a") is True
        async with asyncio.timeout(10):
            assert await heard.get() == "resp_on_a"
    finally:
        await b.close()
        await a.close()


async def test_replicas_migrating_at_once_apply_each_version_once(postgres_url: str, admin: asyncpg.Connection) -> None:
    versions = await asyncio.gather(*(migrate_database(postgres_url) for _ in range(6)))
    assert versions == [len(POSTGRES)] * 6
    applied = await admin.fetch("SELECT version FROM antwort_schema_migrations ORDER BY version")
    assert [r["version"] for r in applied] == list(range(1, len(POSTGRES) + 1))


async def test_the_migrate_command_applies_the_schema_and_is_idempotent(
    postgres_url: str, admin: asyncpg.Connection
) -> None:
    for _ in range(2):
        done = await run_cli("migrate", "--store", postgres_url)
        assert done.returncode == 0, done.stderr
        assert f"schema version {len(POSTGRES)}" in done.stdout
    assert await admin.fetchval("SELECT to_regclass('antwort_responses') IS NOT NULL")
    # Migrating creates no gateway traces: no sessions left, nothing swept.
    assert await admin.fetchval("SELECT count(*) FROM antwort_responses") == 0
