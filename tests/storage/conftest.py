"""Stores under test: each test gets an empty database of the kind it is parametrized with, on a
real SQLite file or a real PostgreSQL server (tests/pg.py)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from antwort_grpc.storage.memory import MemoryDatabase, MemoryStore
from antwort_grpc.storage.options import StoreOptions, new_instance_id
from antwort_grpc.storage.postgres import PostgresStore
from antwort_grpc.storage.sqlite import SQLiteStore
from tests.pg import postgres_server

KINDS = ["memory", "sqlite", "postgres"]


@pytest.fixture(scope="session")
def postgres_admin_url() -> Iterator[str]:
    with postgres_server() as url:
        yield url


@asynccontextmanager
async def empty_database(admin_url: str) -> AsyncIterator[str]:
    """An empty PostgreSQL schema of its own for one test. The URL selects it (asyncpg sends
    `search_path` to the server), so the stores of a test see nothing of any other test. A schema
    takes milliseconds; CREATE DATABASE costs a checkpoint each time."""
    name = "t_" + os.urandom(6).hex()
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f"CREATE SCHEMA {name}")
        yield f"{admin_url}?search_path={name}"
        await admin.execute(f"DROP SCHEMA {name} CASCADE")
    finally:
        await admin.close()


@pytest.fixture
async def postgres_url(postgres_admin_url: str) -> AsyncIterator[str]:
    async with empty_database(postgres_admin_url) as url:
        yield url


class FakeClock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Backend:
    """One database of one kind; `open` opens a store on it as a new gateway process would."""

    kind: str
    target: Any
    clock: FakeClock = field(default_factory=FakeClock)
    opened: list[Any] = field(default_factory=list)

    def options(self, **overrides: Any) -> StoreOptions:
        # Upkeep an hour apart: tests call the steps themselves, nothing runs behind their back.
        base = StoreOptions(clock=self.clock, maintenance_interval=3600.0, instance_id=new_instance_id())
        return replace(base, **overrides)

    async def open(self, **overrides: Any) -> Any:
        options = self.options(**overrides)
        store: Any
        if self.kind == "memory":
            store = MemoryStore(options, self.target)
        elif self.kind == "sqlite":
            store = await SQLiteStore.open(self.target, options)
        else:
            store = await PostgresStore.open(self.target, options)
        self.opened.append(store)
        return store

    async def close(self, store: Any) -> None:
        self.opened.remove(store)
        await store.close()


@pytest.fixture(params=KINDS)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    async with AsyncExitStack() as stack:
        target: Any
        if request.param == "memory":
            target = MemoryDatabase()
        elif request.param == "sqlite":
            target = tmp_path / "store.db"
        else:
            target = await stack.enter_async_context(empty_database(request.getfixturevalue("postgres_admin_url")))
        backend = Backend(request.param, target)
        yield backend
        for store in list(backend.opened):
            await backend.close(store)


@pytest.fixture
async def store(backend: Backend) -> Any:
    return await backend.open()
