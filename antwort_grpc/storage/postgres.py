"""The store for replicas: PostgreSQL through an asyncpg pool.

Which process runs a response: each gateway registers an instance row and beats its heartbeat
every maintenance interval; a running response records the instance that saved it. A response is
orphaned when its instance is gone or silent for `stale_after` seconds; every replica sweeps
orphans (at startup and periodically) to FAILED/interrupted.

Cancel across replicas: CancelResponse on any replica sets the row's cancel flag and sends a
NOTIFY in the same transaction; the running replica LISTENs and stops the response at once. The
flag is polled every maintenance interval too, so a notification lost while the listening
connection reconnects still arrives, late.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import asyncpg

from antwort_grpc import pb
from antwort_grpc.storage.base import ItemPage, StoredResponse
from antwort_grpc.storage.codec import from_row, interrupted, to_row
from antwort_grpc.storage.maintenance import CancelCallbacks, run_every, stop_task
from antwort_grpc.storage.memory import page_items
from antwort_grpc.storage.migrations import RUNNING_SQL, migrate_postgres
from antwort_grpc.storage.options import StoreOptions

log = logging.getLogger(__name__)

CHANNEL = "antwort_cancel"
_LIVE = "(expires_at IS NULL OR expires_at > $3)"
_UPSERT = """INSERT INTO antwort_responses
    (id, owner, status, previous_response_id, created_at, expires_at, instance, response, input_items)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
    ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, status = excluded.status,
        previous_response_id = excluded.previous_response_id, created_at = excluded.created_at,
        expires_at = excluded.expires_at, instance = excluded.instance, response = excluded.response,
        input_items = excluded.input_items"""
_ORPHANS = f"""SELECT r.id, r.response FROM antwort_responses r
    WHERE r.status IN {RUNNING_SQL} AND r.instance <> $1
      AND NOT EXISTS (SELECT 1 FROM antwort_instances i
                      WHERE i.id = r.instance AND i.heartbeat_at > now() - make_interval(secs => $2))
    FOR UPDATE OF r SKIP LOCKED"""

if TYPE_CHECKING:
    Pool = asyncpg.Pool[Any]
    Connection = asyncpg.Connection[Any]


def _ts(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


class PostgresStore:
    def __init__(self, url: str, pool: Pool, options: StoreOptions) -> None:
        self.url = url
        self.pool = pool
        self.options = options
        self._cancels = CancelCallbacks()
        self._listener: Connection | None = None
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, url: str, options: StoreOptions | None = None, *, pool_size: int = 10) -> PostgresStore:
        """Connect, migrate, register this instance, sweep orphans, listen for cancels."""
        options = options or StoreOptions()
        pool = await asyncpg.create_pool(url, min_size=1, max_size=pool_size)
        store = cls(url, pool, options)
        try:
            async with pool.acquire() as conn:
                await migrate_postgres(conn)
            await store.heartbeat()
            await store._listen()
            marked = await store.mark_interrupted()
            if marked:
                log.warning("marked %d responses interrupted: their gateway replicas stopped", marked)
            await store.purge_expired()
        except BaseException:
            await pool.close()
            raise
        steps = [store.heartbeat, store._listen, store.mark_interrupted, store.purge_expired, store.poll_cancels]
        store._task = run_every(options.maintenance_interval, list(steps), "postgres-store-maintenance")
        return store

    async def close(self) -> None:
        await stop_task(self._task)
        if self._listener is not None and not self._listener.is_closed():
            await self._listener.close()
        # Leaving says "nothing of mine still runs": survivors may sweep at once.
        await self.pool.execute("DELETE FROM antwort_instances WHERE id = $1", self.options.instance_id)
        await self.pool.close()

    # -- ResponseStore ------------------------------------------------------------------------

    async def save(self, record: StoredResponse) -> None:
        row = to_row(record, self.options)
        await self.pool.execute(
            _UPSERT,
            row.id,
            row.owner,
            row.status,
            row.previous_response_id,
            _ts(row.created_at),
            _ts(row.expires_at),
            self.options.instance_id,
            row.response,
            row.input_items,
        )

    async def get(self, response_id: str, owner: str = "") -> StoredResponse | None:
        found = await self.pool.fetchrow(
            f"SELECT response, input_items FROM antwort_responses WHERE id = $1 AND owner = $2 AND {_LIVE}",
            response_id,
            owner,
            _ts(self.options.clock()),
        )
        return None if found is None else from_row(found[0], found[1], owner)

    async def delete(self, response_id: str, owner: str = "") -> bool:
        status: str = await self.pool.execute(
            f"DELETE FROM antwort_responses WHERE id = $1 AND owner = $2 AND {_LIVE}",
            response_id,
            owner,
            _ts(self.options.clock()),
        )
        return status != "DELETE 0"

    async def list_input_items(
        self, response_id: str, *, limit: int, after: str, descending: bool, owner: str = ""
    ) -> ItemPage | None:
        record = await self.get(response_id, owner)
        if record is None:
            return None
        return page_items(record.input_items, limit=limit, after=after, descending=descending)

    # -- liveness and Recovery ----------------------------------------------------------------

    async def heartbeat(self) -> None:
        await self.pool.execute(
            """INSERT INTO antwort_instances (id) VALUES ($1)
               ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()""",
            self.options.instance_id,
        )

    async def mark_interrupted(self) -> int:
        """Running rows of instances that left or went silent; never this instance's own."""
        stale = self.options.stale_after
        failed = int(pb.ResponseStatus.RESPONSE_STATUS_FAILED)
        async with self.pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(_ORPHANS, self.options.instance_id, stale)
            await conn.executemany(
                "UPDATE antwort_responses SET status = $2, response = $3 WHERE id = $1",
                [(row["id"], failed, interrupted(row["response"])) for row in rows],
            )
            await conn.execute(
                "DELETE FROM antwort_instances WHERE heartbeat_at < now() - make_interval(secs => $1)", stale
            )
        return len(rows)

    # -- Retention ----------------------------------------------------------------------------

    async def purge_expired(self) -> int:
        status: str = await self.pool.execute(
            f"DELETE FROM antwort_responses WHERE expires_at <= $1 AND status NOT IN {RUNNING_SQL}",
            _ts(self.options.clock()),
        )
        return int(status.split()[-1])

    # -- CancelSignals ------------------------------------------------------------------------

    async def request_cancel(self, response_id: str) -> bool:
        async with self.pool.acquire() as conn, conn.transaction():
            instance = await conn.fetchval(
                f"""UPDATE antwort_responses SET cancel_requested = TRUE
                    WHERE id = $1 AND status IN {RUNNING_SQL} AND (expires_at IS NULL OR expires_at > $2)
                    RETURNING instance""",
                response_id,
                _ts(self.options.clock()),
            )
            if instance is None:
                return False
            # Delivered when the transaction commits, so the flag is visible to the receiver.
            await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, f"{instance}\n{response_id}")
        return True

    def on_cancel(self, callback: Callable[[str], None]) -> None:
        self._cancels.add(callback)

    async def poll_cancels(self) -> int:
        """Cancel flags on this instance's running responses: the fallback for a lost NOTIFY."""
        rows = await self.pool.fetch(
            f"""SELECT id FROM antwort_responses
                WHERE instance = $1 AND status IN {RUNNING_SQL} AND cancel_requested""",
            self.options.instance_id,
        )
        for row in rows:
            self._cancels.deliver(row["id"])
        return len(rows)

    async def _listen(self) -> None:
        """(Re)open the LISTEN connection when it is missing or was lost."""
        if self._listener is not None and not self._listener.is_closed():
            return
        self._listener = await asyncpg.connect(self.url)
        await self._listener.add_listener(CHANNEL, self._notified)

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        instance, _, response_id = str(payload).partition("\n")
        if instance == self.options.instance_id:
            self._cancels.deliver(response_id)
