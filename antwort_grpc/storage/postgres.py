"""The store for replicas: PostgreSQL through an asyncpg pool.

Which replicas are alive: besides its pool, every gateway keeps one session connection of its
own and holds a session-level advisory lock keyed by its instance id there. PostgreSQL releases
that lock the moment the session ends: when the process exits, when it dies (the kernel closes
its sockets on kill -9, OOM kill, crash), or when TCP keepalives find its host gone. A running
response records the instance that saved it. Every replica sweeps (at startup and every
maintenance interval): for each instance with running responses it tries that instance's lock,
and if it gets it, nobody holds it, so the instance is gone and its running responses are marked
FAILED/interrupted. A live replica is never swept however long its responses run; no clocks or
heartbeats are compared.

Cancel across replicas: CancelResponse on any replica sets the row's cancel flag and sends a
NOTIFY in the same transaction; the running replica LISTENs on its session connection and stops
the response at once. The flag is polled every maintenance interval too, so a notification lost
while the session reconnects still arrives, late.

Controls across replicas (steer, approve, pause, ...) travel the same way: a row in
antwort_controls and a NOTIFY naming it; the running replica applies the control, writes its
answer into the row, and the sender, polling the row, returns that answer. Open rows are polled
too.

The session connection must be a real session: through a pooler in transaction mode
(PgBouncer's default) neither the lock nor LISTEN works.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import asyncpg

from antwort_grpc import pb
from antwort_grpc.storage.base import StoredResponse
from antwort_grpc.storage.codec import (
    FAILED,
    RUNNING_SQL,
    InputItemsInTheRow,
    find_item,
    from_row,
    indexed_ids,
    interrupted,
    to_row,
)
from antwort_grpc.storage.conversations import Entry
from antwort_grpc.storage.conversations_sql import PostgresConversations, postgres_append
from antwort_grpc.storage.maintenance import CancelCallbacks, start_upkeep
from antwort_grpc.storage.migrations import migrate_postgres
from antwort_grpc.storage.options import StoreOptions
from antwort_grpc.storage.runlog_postgres import EVENTS_CHANNEL, HANDOVER_CHANNEL, PostgresRunLog
from antwort_grpc.tasks import stop_task

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    Pool = asyncpg.Pool[asyncpg.Record]
    Connection = asyncpg.Connection[asyncpg.Record]
    AnyConnection = Connection | PoolConnectionProxy[asyncpg.Record]

log = logging.getLogger(__name__)

CHANNEL = "antwort_cancel"
CONTROL_CHANNEL = "antwort_control"
# How long a sender waits for the running replica's answer to a control, and its polling gaps.
CONTROL_WAIT = 10.0
CONTROL_POLL = (0.005, 0.1)
# The advisory lock of an instance: a 64-bit hash of its id.
LOCK_KEY = "hashtextextended($1, 0)"
# On the session connection: the server notices a vanished host within about 25 s, not the
# kernel's default of two hours, and releases its lock.
KEEPALIVES = {"tcp_keepalives_idle": "10", "tcp_keepalives_interval": "5", "tcp_keepalives_count": "3"}
# How the gateway's connections show in pg_stat_activity.
APPLICATION = "antwort-grpc"

_LIVE = "(expires_at IS NULL OR expires_at > $3)"
# A background run not ended is resumed by another replica (storage/runlog.py), not given up.
_NOT_RESUMABLE = "id NOT IN (SELECT id FROM antwort_runs WHERE NOT ended)"
# The WHERE keeps a late in-progress write from taking an ended response back to running.
_UPSERT = f"""INSERT INTO antwort_responses
    (id, owner, status, previous_response_id, created_at, expires_at, instance, response, input_items)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
    ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, status = excluded.status,
        previous_response_id = excluded.previous_response_id, created_at = excluded.created_at,
        expires_at = excluded.expires_at, instance = excluded.instance, response = excluded.response,
        input_items = excluded.input_items
    WHERE antwort_responses.status IN {RUNNING_SQL} OR excluded.status NOT IN {RUNNING_SQL}"""
# An ended response: saved, and the ids of its items indexed once a client has referred to an
# item in this database (any replica), in one statement (one round trip).
_ITEMS_INDEXED = "items_indexed"
_ITEMS_BACKFILLED = "items_backfilled"
_UPSERT_INDEXED = f"""WITH saved AS ({_UPSERT} RETURNING id)
    INSERT INTO antwort_items (owner, item_id, response_id)
    SELECT $2, item_id, saved.id FROM saved, unnest($10::text[]) AS item_id
    WHERE EXISTS (SELECT 1 FROM antwort_settings WHERE name = '{_ITEMS_INDEXED}')
    ON CONFLICT DO NOTHING"""
# Serializes the replicas that switch the index on.
_INDEXING_LOCK = 0x616E7478
# The latest live response of the owner holding each item.
_HOLDERS = """SELECT DISTINCT ON (i.item_id) i.item_id, r.id, r.response, r.input_items FROM antwort_items i
    JOIN antwort_responses r ON r.id = i.response_id
    WHERE i.owner = $1 AND i.item_id = ANY($2::text[]) AND r.owner = i.owner
        AND (r.expires_at IS NULL OR r.expires_at > $3)
    ORDER BY i.item_id, r.created_at DESC"""


def _ts(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


async def migrate_database(url: str) -> int:
    """Apply the schema migrations (`antwort-grpc migrate`); the version reached."""
    conn = await asyncpg.connect(url)
    try:
        return await migrate_postgres(conn)
    finally:
        await conn.close()


class PostgresStore(InputItemsInTheRow):
    def __init__(self, url: str, pool: Pool, options: StoreOptions) -> None:
        self.url = url
        self.pool = pool
        self.options = options
        self._cancels = CancelCallbacks()
        self._control_handler: Callable[[str, pb.Control], pb.ControlRejected] | None = None
        self._answering: set[asyncio.Task[None]] = set()
        self._session: Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self.runlog = PostgresRunLog(pool, options)
        self.conversations = PostgresConversations(pool)
        # The index of items is complete (the switch is on and what was stored before is in it).
        self._items_indexed = False

    @classmethod
    async def open(cls, url: str, options: StoreOptions | None = None, *, pool_size: int = 10) -> PostgresStore:
        """Connect, migrate, take this instance's lock and listen, sweep, start the upkeep."""
        options = options or StoreOptions()
        pool = await asyncpg.create_pool(
            url, min_size=1, max_size=pool_size, server_settings={"application_name": APPLICATION}
        )
        store = cls(url, pool, options)
        try:
            async with pool.acquire() as conn:
                await migrate_postgres(conn)
            await store._ensure_session()
            marked = await store.mark_interrupted()
            if marked:
                log.warning("marked %d responses interrupted: their gateway replicas stopped", marked)
            steps = [
                store._ensure_session,
                store.mark_interrupted,
                store.poll_cancels,
                store.poll_controls,
                store.runlog.purge_logs,
            ]
            store._task = await start_upkeep(options, steps, store.purge_expired, "postgres-store-upkeep")
        except BaseException:
            await store._close_session()
            await pool.close()
            raise
        return store

    async def close(self) -> None:
        await stop_task(self._task)
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                await _mark_instance(conn, self.options.instance_id)
        finally:
            await self._close_session()
            await self.pool.close()

    # -- ResponseStore ------------------------------------------------------------------------

    async def save(self, record: StoredResponse) -> None:
        await self.pool.execute(*self._upsert(record))

    def _upsert(self, record: StoredResponse) -> tuple[Any, ...]:
        """The statement that saves `record`, and its arguments."""
        row = to_row(record, self.options)
        indexed = (list(row.item_ids),) if row.item_ids else ()
        return (
            _UPSERT_INDEXED if indexed else _UPSERT,
            row.id,
            row.owner,
            row.status,
            row.previous_response_id,
            _ts(row.created_at),
            _ts(row.expires_at),
            self.options.instance_id,
            row.response,
            row.input_items,
            *indexed,
        )

    async def save_in_conversation(
        self, record: StoredResponse, conversation_id: str, entries: Sequence[Entry]
    ) -> bool:
        upsert = self._upsert(record)
        async with self.pool.acquire() as conn, conn.transaction():
            # The conversation's row first (as every append): its lock orders concurrent appends.
            appended = await postgres_append(conn, conversation_id, entries, record.owner)
            await conn.execute(*upsert)
        return appended

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

    async def find_items(self, item_ids: Sequence[str], owner: str = "") -> dict[str, pb.Item]:
        if not self._items_indexed:
            await self._index_items()
        rows = await self.pool.fetch(_HOLDERS, owner, list(item_ids), _ts(self.options.clock()))
        found: dict[str, pb.Item] = {}
        decoded: dict[str, StoredResponse] = {}
        for row in rows:
            key = row["id"]
            record = decoded.get(key) or decoded.setdefault(key, from_row(row["response"], row["input_items"], owner))
            item = find_item(record, row["item_id"])
            if item is not None:
                found[row["item_id"]] = item
        return found

    async def _index_items(self) -> None:
        """From the first item reference on (on any replica): final saves index their items, and
        what was stored before is indexed once. The switch is committed before that indexing
        reads, so a save that commits after its snapshot indexes itself."""
        async with self.pool.acquire() as conn:
            await conn.execute("SELECT pg_advisory_lock($1)", _INDEXING_LOCK)
            try:
                done = await conn.fetchval("SELECT 1 FROM antwort_settings WHERE name = $1", _ITEMS_BACKFILLED)
                if done is None:
                    await conn.execute(_SETTING, _ITEMS_INDEXED)
                    await _await_older_transactions(conn)
                    async with conn.transaction():
                        await _index_stored(conn)
                        await conn.execute(_SETTING, _ITEMS_BACKFILLED)
            finally:
                await conn.execute("SELECT pg_advisory_unlock($1)", _INDEXING_LOCK)
        self._items_indexed = True

    # -- liveness and the sweep -----------------------------------------------------------------

    async def _ensure_session(self) -> None:
        """(Re)open the session connection: this instance's lock and the cancel listener."""
        if self._session is not None and not self._session.is_closed():
            return
        reconnect = self._session is not None
        settings = {**KEEPALIVES, "application_name": f"{APPLICATION} session"}
        conn: Connection = await asyncpg.connect(self.url, server_settings=settings)
        try:
            # Waits only while a sweeper holds it for a moment (after this session was lost).
            await conn.execute(f"SELECT pg_advisory_lock({LOCK_KEY})", self.options.instance_id)
            await conn.add_listener(CHANNEL, self._notified)
            await conn.add_listener(CONTROL_CHANNEL, self._control_notified)
            await conn.add_listener(EVENTS_CHANNEL, self.runlog.events_notified)
            await conn.add_listener(HANDOVER_CHANNEL, self.runlog.handover_notified)
        except BaseException:
            await conn.close()
            raise
        self._session = conn
        if reconnect:
            log.warning("store session reconnected; cancels sent meanwhile arrive through the flag poll")
            await self.poll_cancels()

    async def _close_session(self) -> None:
        if self._session is not None and not self._session.is_closed():
            await self._session.close()

    async def mark_interrupted(self) -> int:
        """Mark the running responses of every instance whose lock is free; how many."""
        marked = 0
        async with self.pool.acquire() as conn:
            instances = await conn.fetch(
                f"""SELECT DISTINCT instance FROM antwort_responses WHERE status IN {RUNNING_SQL} AND instance <> $1
                    AND {_NOT_RESUMABLE}""",
                self.options.instance_id,
            )
            for (instance,) in instances:
                async with conn.transaction():
                    # Granted only when no session holds the lock: that instance has ended.
                    if await conn.fetchval(f"SELECT pg_try_advisory_xact_lock({LOCK_KEY})", instance):
                        marked += await _mark_instance(conn, instance)
        return marked

    async def purge_expired(self) -> int:
        status: str = await self.pool.execute(
            f"DELETE FROM antwort_responses WHERE expires_at <= $1 AND status NOT IN {RUNNING_SQL}",
            _ts(self.options.clock()),
        )
        return int(status.split()[-1])

    # -- CancelSignals ------------------------------------------------------------------------

    async def request_cancel(self, response_id: str, owner: str = "") -> bool:
        async with self.pool.acquire() as conn, conn.transaction():
            instance = await conn.fetchval(
                f"""UPDATE antwort_responses SET cancel_requested = TRUE
                    WHERE id = $1 AND owner = $2 AND status IN {RUNNING_SQL} AND {_LIVE}
                    RETURNING instance""",
                response_id,
                owner,
                _ts(self.options.clock()),
            )
            if instance is None:
                return False
            # Delivered when the transaction commits, so the flag is visible to the receiver.
            await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, f"{instance}\n{response_id}")
        return True

    def on_cancel(self, callback: Callable[[str], object]) -> Callable[[], None]:
        return self._cancels.add(callback)

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

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        instance, _, response_id = str(payload).partition("\n")
        if instance == self.options.instance_id:
            self._cancels.deliver(response_id)

    # -- ControlSignals -------------------------------------------------------------------------

    async def send_control(self, response_id: str, owner: str, control: pb.Control) -> pb.ControlRejected | None:
        async with self.pool.acquire() as conn, conn.transaction():
            instance = await conn.fetchval(
                f"SELECT instance FROM antwort_responses WHERE id = $1 AND owner = $2 AND status IN {RUNNING_SQL}",
                response_id,
                owner,
            )
            if instance is None:
                return pb.ControlRejected(
                    code=9, message=f"response {response_id!r} is not in progress", reason="not_in_progress"
                )
            control_id = await conn.fetchval(
                "INSERT INTO antwort_controls (response_id, instance, control) VALUES ($1, $2, $3) RETURNING id",
                response_id,
                instance,
                control.SerializeToString(),
            )
            await conn.execute("SELECT pg_notify($1, $2)", CONTROL_CHANNEL, f"{instance}\n{control_id}")
        delay, longest = CONTROL_POLL
        try:
            async with asyncio.timeout(CONTROL_WAIT):
                while True:
                    await asyncio.sleep(delay)
                    answer = await self.pool.fetchval("SELECT answer FROM antwort_controls WHERE id = $1", control_id)
                    if answer is not None:
                        return pb.ControlRejected.FromString(answer)
                    delay = min(delay * 2, longest)
        except TimeoutError:
            return None
        finally:
            await self.pool.execute("DELETE FROM antwort_controls WHERE id = $1", control_id)

    def on_control(self, callback: Callable[[str, pb.Control], pb.ControlRejected]) -> Callable[[], None]:
        self._control_handler = callback

        def remove() -> None:
            self._control_handler = None

        return remove

    async def poll_controls(self) -> int:
        """Unanswered controls for this instance (a NOTIFY lost while reconnecting); and the
        rows of senders that died waiting."""
        await self.pool.execute("DELETE FROM antwort_controls WHERE created_at < now() - interval '1 hour'")
        rows = await self.pool.fetch(
            "SELECT id FROM antwort_controls WHERE instance = $1 AND answer IS NULL", self.options.instance_id
        )
        for row in rows:
            await self._answer(row["id"])
        return len(rows)

    def _control_notified(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        instance, _, control_id = str(payload).partition("\n")
        if instance == self.options.instance_id and control_id.isdigit():
            task = asyncio.get_running_loop().create_task(self._answer(int(control_id)))
            self._answering.add(task)
            task.add_done_callback(self._answering.discard)

    async def _answer(self, control_id: int) -> None:
        handler = self._control_handler
        if handler is None:
            return
        try:
            row = await self.pool.fetchrow(
                "SELECT response_id, control FROM antwort_controls WHERE id = $1 AND answer IS NULL", control_id
            )
            if row is None:
                return
            answer = handler(row["response_id"], pb.Control.FromString(row["control"]))
            await self.pool.execute(
                "UPDATE antwort_controls SET answer = $2 WHERE id = $1", control_id, answer.SerializeToString()
            )
        except Exception:
            log.exception("answering control %s failed", control_id)


_SETTING = "INSERT INTO antwort_settings (name, value) VALUES ($1, '1') ON CONFLICT DO NOTHING"
# How long the indexing waits for the transactions that began before the switch.
OLDER_WAIT = 5.0


async def _await_older_transactions(conn: AnyConnection) -> None:
    """Wait (a while at most) until every transaction that began before now has ended: a save
    whose statement started before the switch was committed (so did not index itself) is then
    visible to the indexing that follows."""
    horizon = await conn.fetchval("SELECT pg_snapshot_xmax(pg_current_snapshot())::text")
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(OLDER_WAIT):
            sql = "SELECT pg_snapshot_xmin(pg_current_snapshot()) < $1::text::xid8"
            while True:
                if not await conn.fetchval(sql, horizon):
                    return
                await asyncio.sleep(0.01)  # nothing to wait on but the database's own view


async def _index_stored(conn: AnyConnection) -> None:
    """Index the items of every ended response stored (inside the caller's transaction)."""
    async for row in conn.cursor(
        f"SELECT id, owner, response, input_items FROM antwort_responses WHERE status NOT IN {RUNNING_SQL}"
    ):
        ids = indexed_ids(from_row(row["response"], row["input_items"], row["owner"]))
        if ids:
            await conn.execute(
                "INSERT INTO antwort_items (owner, item_id, response_id) SELECT $1, unnest($2::text[]), $3 "
                "ON CONFLICT DO NOTHING",
                row["owner"],
                list(ids),
                row["id"],
            )


async def _mark_instance(conn: AnyConnection, instance: str) -> int:
    """Mark an ended instance's running responses interrupted (inside the caller's transaction)."""
    rows = await conn.fetch(
        f"""SELECT id, response FROM antwort_responses WHERE instance = $1 AND status IN {RUNNING_SQL}
            AND {_NOT_RESUMABLE} FOR UPDATE""",
        instance,
    )
    await conn.executemany(
        "UPDATE antwort_responses SET status = $2, response = $3 WHERE id = $1",
        [(row["id"], FAILED, interrupted(row["response"])) for row in rows],
    )
    return len(rows)


__all__ = ["PostgresStore", "migrate_database"]
