"""The SQLite store's RunLog (storage/runlog.py) in the store's file, through its writer and reader
threads: an append of a batch of events is one job of the writer's group commit.

One gateway uses the file (its lock says so), so a run leased to any other instance was left by
a process that ended: a restarted gateway claims those at once, without waiting for the lease.
Readers of the log are in this process; they are told of appends directly.
"""

from __future__ import annotations

import sqlite3

from antwort_grpc.storage.options import StoreOptions
from antwort_grpc.storage.runlog import Batch, Checkpoint, Claim, Events, LogState, Remembered, StoreRunLog
from antwort_grpc.storage.sqlite_worker import SQLiteWorker

_HELD = "id = ? AND lease_instance = ? AND ended = 0"


class SQLiteRunLog(StoreRunLog):
    def __init__(self, writer: SQLiteWorker, reader: SQLiteWorker, options: StoreOptions) -> None:
        super().__init__(options)
        self.writer = writer
        self.reader = reader

    async def begin(self, response_id: str, owner: str, request: bytes, lease: float) -> None:
        row = (response_id, owner, request, self._me, self.options.clock() + lease)
        sql = """INSERT OR REPLACE INTO antwort_runs (id, owner, request, lease_instance, lease_until)
                 VALUES (?, ?, ?, ?, ?)"""
        await self.writer.run(lambda conn: conn.execute(sql, row))

    async def _write(self, batch: Batch) -> bool:
        me, response_id, checkpoint = self._me, batch.response_id, batch.checkpoint

        def write(conn: sqlite3.Connection) -> bool:
            updated = conn.execute(
                f"""UPDATE antwort_runs SET last_seq = coalesce(?, last_seq), log_bytes = log_bytes + ?,
                    ended = ?, expires_at = ? WHERE {_HELD} RETURNING truncated""",
                (batch.last, batch.size, int(batch.ended), batch.expires_at, response_id, me),
            ).fetchone()
            if updated is None:
                return False
            if checkpoint is not None:
                conn.execute(
                    "UPDATE antwort_runs SET cp_response = ?, cp_turn = ?, cp_round = ?, cp_seq = ? WHERE id = ?",
                    (checkpoint.response, checkpoint.turn, checkpoint.round, checkpoint.sequence_number, response_id),
                )
            if not updated[0]:
                conn.executemany(
                    "INSERT OR IGNORE INTO antwort_events (response_id, seq, event) VALUES (?, ?, ?)",
                    [(response_id, seq, data) for seq, data in batch.events],
                )
            return True

        return bool(await self.writer.run(write))

    async def truncate(self, response_id: str) -> None:
        def truncate(conn: sqlite3.Connection) -> None:
            conn.execute("UPDATE antwort_runs SET truncated = 1 WHERE id = ?", (response_id,))
            conn.execute("DELETE FROM antwort_events WHERE response_id = ?", (response_id,))

        await self.writer.run(truncate)

    async def checkpoint(self, response_id: str, checkpoint: Checkpoint) -> bool:
        values = (checkpoint.response, checkpoint.turn, checkpoint.round, checkpoint.sequence_number)
        sql = f"UPDATE antwort_runs SET cp_response = ?, cp_turn = ?, cp_round = ?, cp_seq = ? WHERE {_HELD}"
        return bool(await self.writer.run(lambda conn: conn.execute(sql, (*values, response_id, self._me)).rowcount))

    async def state(self, response_id: str, owner: str) -> LogState | None:
        now = self.options.clock()
        sql = """SELECT last_seq, ended, truncated, expires_at, log_bytes FROM antwort_runs
                 WHERE id = ? AND owner = ?"""
        found = await self.reader.run(lambda conn: conn.execute(sql, (response_id, owner)).fetchone())
        if found is None:
            return None
        last, ended, truncated, expires, size = found
        return LogState(last, bool(ended), bool(truncated), expires is not None and expires <= now, size)

    async def events(self, response_id: str, after: int, limit: int) -> Events:
        sql = "SELECT seq, event FROM antwort_events WHERE response_id = ? AND seq > ? ORDER BY seq LIMIT ?"
        rows = await self.reader.run(lambda conn: conn.execute(sql, (response_id, after, limit)).fetchall())
        return [(seq, bytes(data)) for seq, data in rows]

    async def renew(self, response_ids: list[str], lease: float) -> list[str]:
        if not response_ids:
            return []
        until, me = self.options.clock() + lease, self._me

        def renew(conn: sqlite3.Connection) -> list[str]:
            lost = []
            for response_id in response_ids:
                sql = f"UPDATE antwort_runs SET lease_until = ? WHERE {_HELD}"
                if not conn.execute(sql, (until, response_id, me)).rowcount:
                    lost.append(response_id)
            return lost

        return await self.writer.run(renew)

    async def release(self, response_ids: list[str]) -> None:
        me = self._me
        sql = f"UPDATE antwort_runs SET lease_until = 0, handed_over = 1 WHERE {_HELD}"
        await self.writer.run(lambda conn: conn.executemany(sql, [(i, me) for i in response_ids]))
        self.watchers.handed_over()

    async def claim(self, lease: float, limit: int) -> list[Claim]:
        # Any other instance's run was left by a process that ended (the file lock says so);
        # never its own: fencing tells processes apart by instance, not by claim.
        now, me = self.options.clock(), self._me

        def claim(conn: sqlite3.Connection) -> list[Claim]:
            rows = conn.execute(
                """SELECT id, owner, request, last_seq, handed_over, cp_response, cp_turn, cp_round, cp_seq
                   FROM antwort_runs WHERE ended = 0 AND lease_instance <> ? LIMIT ?""",
                (me, limit),
            ).fetchall()
            claims = []
            for key, owner, request, last, handed, response, turn, round_, seq in rows:
                conn.execute(
                    "UPDATE antwort_runs SET lease_instance = ?, lease_until = ?, handed_over = 0 WHERE id = ?",
                    (me, now + lease, key),
                )
                checkpoint = Checkpoint(bytes(response), turn, round_, seq) if response is not None else None
                tail = conn.execute(
                    "SELECT event FROM antwort_events WHERE response_id = ? AND seq > ? ORDER BY seq",
                    (key, seq if response is not None else 0),
                ).fetchall()
                claims.append(
                    Claim(key, owner, bytes(request), checkpoint, last, bool(handed), [bytes(t[0]) for t in tail])
                )
            return claims

        return await self.writer.run(claim)

    async def next_expiry(self) -> float | None:
        # Another instance's runs are claimed at once (its process ended): no lease to wait for.
        return None

    async def remember(self, owner: str, key: str, digest: str, response_id: str, ttl: float) -> Remembered | None:
        now = self.options.clock()

        def remember(conn: sqlite3.Connection) -> Remembered | None:
            found = conn.execute(
                "SELECT response_id, digest FROM antwort_idempotency WHERE owner = ? AND key = ? AND expires_at > ?",
                (owner, key, now),
            ).fetchone()
            if found is not None:
                return Remembered(found[0], found[1])
            conn.execute(
                "INSERT OR REPLACE INTO antwort_idempotency (owner, key, digest, response_id, expires_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (owner, key, digest, response_id, now + ttl),
            )
            return None

        return await self.writer.run(remember)

    async def forget(self, owner: str, key: str) -> None:
        sql = "DELETE FROM antwort_idempotency WHERE owner = ? AND key = ?"
        await self.writer.run(lambda conn: conn.execute(sql, (owner, key)))

    async def purge_logs(self) -> int:
        now = self.options.clock()

        def purge(conn: sqlite3.Connection) -> int:
            gone = conn.execute("DELETE FROM antwort_runs WHERE expires_at <= ? RETURNING id", (now,)).fetchall()
            conn.executemany("DELETE FROM antwort_events WHERE response_id = ?", gone)
            keys = conn.execute("DELETE FROM antwort_idempotency WHERE expires_at <= ?", (now,)).rowcount
            return len(gone) + keys

        return await self.writer.run(purge)
