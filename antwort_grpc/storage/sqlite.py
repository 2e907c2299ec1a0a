"""The embedded default store: one SQLite file in WAL mode, used by one gateway process.

Writes go through one writer thread (group commit), reads through one reader thread (WAL lets
them proceed while a write commits); the event loop only awaits futures. An exclusive lock on
`<file>.lock` keeps a second gateway off the same file. That lock is also how a restart tells a
crash: whoever holds it is the only process that can be running responses, so every running row
found when the file is opened was left by a process that died, and is marked FAILED/interrupted.
The kernel releases the lock when a process dies, kill -9 included. Replicas share PostgreSQL.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path

from antwort_grpc import pb
from antwort_grpc.storage.base import StoredResponse
from antwort_grpc.storage.codec import (
    FAILED,
    RUNNING_SQL,
    InputItemsInTheRow,
    Row,
    find_item,
    from_row,
    indexed_ids,
    interrupted,
    to_row,
)
from antwort_grpc.storage.conversations import Entry
from antwort_grpc.storage.conversations_sql import SQLiteConversations, sqlite_append
from antwort_grpc.storage.maintenance import CancelCallbacks, start_upkeep
from antwort_grpc.storage.migrations import migrate_sqlite
from antwort_grpc.storage.options import StoreOptions
from antwort_grpc.storage.runlog_sqlite import SQLiteRunLog
from antwort_grpc.storage.sqlite_worker import SQLiteWorker
from antwort_grpc.tasks import stop_task

log = logging.getLogger(__name__)

_LIVE = "(expires_at IS NULL OR expires_at > ?)"
# The WHERE keeps a late in-progress write from taking an ended response back to running.
_UPSERT = f"""INSERT INTO antwort_responses
    (id, owner, status, previous_response_id, created_at, expires_at, response, input_items)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, status = excluded.status,
        previous_response_id = excluded.previous_response_id, created_at = excluded.created_at,
        expires_at = excluded.expires_at, response = excluded.response, input_items = excluded.input_items
    WHERE antwort_responses.status IN {RUNNING_SQL} OR excluded.status NOT IN {RUNNING_SQL}"""
# The latest live response of the owner that holds an item.
_HOLDER = """SELECT r.id, r.response, r.input_items FROM antwort_items i
    JOIN antwort_responses r ON r.id = i.response_id
    WHERE i.owner = ? AND i.item_id = ? AND r.owner = i.owner AND (r.expires_at IS NULL OR r.expires_at > ?)
    ORDER BY r.created_at DESC LIMIT 1"""


class StoreInUse(RuntimeError):
    """Another gateway process has this SQLite file open."""


def _lock(path: Path) -> int:
    lock_path = path.with_name(path.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreInUse(
            f"{path} is used by another antwort-grpc process; SQLite serves one gateway, "
            "replicas share a PostgreSQL store (ANTWORT_STORE=postgresql://…)"
        ) from None
    return fd


def migrate_file(path: Path) -> int:
    """Apply the schema migrations to a file (`antwort-grpc migrate`); the version reached.
    Safe next to a running gateway: the migration takes SQLite's write lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout = 10000")
        conn.execute("PRAGMA journal_mode = WAL")
        return migrate_sqlite(conn)
    finally:
        conn.close()


class SQLiteStore(InputItemsInTheRow):
    def __init__(self, path: Path, options: StoreOptions, writer: SQLiteWorker, reader: SQLiteWorker, lock: int):
        self.path = path
        self.options = options
        self.writer = writer
        self.reader = reader
        self._lock = lock
        self._cancels = CancelCallbacks()
        self._task: asyncio.Task[None] | None = None
        self.runlog = SQLiteRunLog(writer, reader, options)
        self.conversations = SQLiteConversations(writer, reader)
        # Whether saves index their items (a client has referred to one in this database), and
        # the indexing of what was stored before, while it runs.
        self._items_indexed = False
        self._indexing: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, path: Path, options: StoreOptions | None = None, *, synchronous: str = "NORMAL") -> SQLiteStore:
        """Lock the file, migrate it, mark what a dead process left running, start the purge."""
        options = options or StoreOptions()
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = _lock(path)
        writer = SQLiteWorker(path, writer=True, synchronous=synchronous)
        reader = SQLiteWorker(path, writer=False)
        try:
            await writer.start()
            await writer.run(migrate_sqlite, alone=True)
            await reader.start()
        except BaseException:
            await reader.close()
            await writer.close()
            os.close(lock)
            raise
        store = cls(path, options, writer, reader, lock)
        store._items_indexed = await reader.run(_items_indexed)
        marked = await store._mark_running_interrupted()
        if marked:
            log.warning("marked %d responses interrupted: left in progress by a gateway that stopped", marked)
        store._task = await start_upkeep(options, [store.runlog.purge_logs], store.purge_expired, "sqlite-store-purge")
        return store

    async def close(self) -> None:
        await stop_task(self._task)
        try:
            await self._mark_running_interrupted()
        finally:
            await self.reader.close()
            await self.writer.close()
            os.close(self._lock)

    # -- ResponseStore ------------------------------------------------------------------------

    async def save(self, record: StoredResponse) -> None:
        # The row is made and queued in one step: a save made before indexing began is written
        # before the indexing of what is stored, one made after carries its ids.
        row = to_row(record, self.options, index=self._items_indexed)
        await self.writer.run(lambda conn: _upsert(conn, row))

    async def save_in_conversation(
        self, record: StoredResponse, conversation_id: str, entries: Sequence[Entry]
    ) -> bool:
        row = to_row(record, self.options, index=self._items_indexed)

        def save(conn: sqlite3.Connection) -> bool:
            # One job of the writer: one savepoint, all or nothing.
            appended = sqlite_append(conn, conversation_id, entries, record.owner)
            _upsert(conn, row)
            return appended

        return await self.writer.run(save)

    async def get(self, response_id: str, owner: str = "") -> StoredResponse | None:
        now = self.options.clock()

        def read(conn: sqlite3.Connection) -> StoredResponse | None:
            found = conn.execute(
                f"SELECT response, input_items FROM antwort_responses WHERE id = ? AND owner = ? AND {_LIVE}",
                (response_id, owner, now),
            ).fetchone()
            return None if found is None else from_row(found[0], found[1], owner)

        return await self.reader.run(read)

    async def delete(self, response_id: str, owner: str = "") -> bool:
        now = self.options.clock()

        def delete(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                f"DELETE FROM antwort_responses WHERE id = ? AND owner = ? AND {_LIVE}", (response_id, owner, now)
            )
            return cursor.rowcount > 0

        return await self.writer.run(delete)

    async def find_items(self, item_ids: Sequence[str], owner: str = "") -> dict[str, pb.Item]:
        if not self._items_indexed or self._indexing is not None:
            await self._index_items()
        now = self.options.clock()

        def read(conn: sqlite3.Connection) -> dict[str, pb.Item]:
            found: dict[str, pb.Item] = {}
            decoded: dict[str, StoredResponse] = {}
            for item_id in item_ids:
                row = conn.execute(_HOLDER, (owner, item_id, now)).fetchone()
                if row is None:
                    continue
                record = decoded.get(row[0]) or decoded.setdefault(row[0], from_row(row[1], row[2], owner))
                item = find_item(record, item_id)
                if item is not None:
                    found[item_id] = item
            return found

        return await self.reader.run(read)

    async def _index_items(self) -> None:
        """From the first item reference on: saves index their items, and what is stored already
        is indexed once (one transaction in the writer, before any save made after it)."""
        if self._indexing is None:
            self._items_indexed = True
            self._indexing = asyncio.ensure_future(self.writer.run(_index_stored, alone=True))
        indexing = self._indexing
        try:
            await asyncio.shield(indexing)
        except BaseException:
            if indexing.done() and not indexing.cancelled() and indexing.exception() is not None:
                self._items_indexed = False  # the next lookup tries again
                self._indexing = None
            raise
        self._indexing = None

    # -- upkeep and cancel ----------------------------------------------------------------------

    async def _mark_running_interrupted(self) -> int:
        """Every running row: at open they are a dead process's, at close this one's that never
        ended (the file lock says no other process runs any)."""

        def mark(conn: sqlite3.Connection) -> int:
            # A background run not ended is resumed (storage/runlog.py), not given up.
            rows = conn.execute(
                f"""SELECT id, response FROM antwort_responses WHERE status IN {RUNNING_SQL}
                    AND id NOT IN (SELECT id FROM antwort_runs WHERE ended = 0)"""
            ).fetchall()
            conn.executemany(
                "UPDATE antwort_responses SET status = ?, response = ? WHERE id = ?",
                [(FAILED, interrupted(response), key) for key, response in rows],
            )
            return len(rows)

        return await self.writer.run(mark)

    async def purge_expired(self) -> int:
        now = self.options.clock()
        sql = f"DELETE FROM antwort_responses WHERE expires_at <= ? AND status NOT IN {RUNNING_SQL}"
        return await self.writer.run(lambda conn: conn.execute(sql, (now,)).rowcount)

    async def request_cancel(self, response_id: str, owner: str = "") -> bool:
        """One process per file: the response runs here, if anywhere."""
        now = self.options.clock()
        sql = f"SELECT 1 FROM antwort_responses WHERE id = ? AND owner = ? AND status IN {RUNNING_SQL} AND {_LIVE}"
        running = await self.reader.run(
            lambda conn: conn.execute(sql, (response_id, owner, now)).fetchone() is not None
        )
        if running:
            self._cancels.deliver(response_id)
        return running

    def on_cancel(self, callback: Callable[[str], object]) -> Callable[[], None]:
        return self._cancels.add(callback)


_ITEMS_INDEXED = "items_indexed"


def _items_indexed(conn: sqlite3.Connection) -> bool:
    sql = "SELECT 1 FROM antwort_settings WHERE name = ?"
    return conn.execute(sql, (_ITEMS_INDEXED,)).fetchone() is not None


def _index_stored(conn: sqlite3.Connection) -> None:
    """Index the items of every ended response stored, and say that saves index theirs."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("INSERT OR IGNORE INTO antwort_settings (name, value) VALUES (?, '1')", (_ITEMS_INDEXED,))
        rows = conn.execute(
            f"SELECT owner, response, input_items FROM antwort_responses WHERE status NOT IN {RUNNING_SQL}"
        )
        for owner, response, input_items in rows:
            record = from_row(response, input_items, owner)
            conn.executemany(
                "INSERT OR IGNORE INTO antwort_items (owner, item_id, response_id) VALUES (?, ?, ?)",
                [(owner, item_id, record.response.id) for item_id in indexed_ids(record)],
            )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _upsert(conn: sqlite3.Connection, row: Row) -> None:
    conn.execute(
        _UPSERT,
        (
            row.id,
            row.owner,
            row.status,
            row.previous_response_id,
            row.created_at,
            row.expires_at,
            row.response,
            row.input_items,
        ),
    )
    if row.item_ids:
        conn.executemany(
            "INSERT OR IGNORE INTO antwort_items (owner, item_id, response_id) VALUES (?, ?, ?)",
            [(row.owner, item_id, row.id) for item_id in row.item_ids],
        )


__all__ = ["SQLiteStore", "StoreInUse", "migrate_file"]
