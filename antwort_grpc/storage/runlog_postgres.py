"""The PostgreSQL store's RunLog (storage/runlog.py), shared by the replicas.

An append is one statement: the lease check, the log's counters, the events and a NOTIFY naming
the response (delivered when it commits), so a replica that lost the lease writes nothing and
readers on every replica hear of what was written. A handover NOTIFYs too, so the other replicas
claim the runs at once instead of at their next look. Claims lock the rows they take
(FOR UPDATE SKIP LOCKED): two replicas never take the same run, and a replica never claims its
own (its fencing is by instance: a run it still drives must not get a second runner).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from antwort_grpc.storage.options import StoreOptions
from antwort_grpc.storage.runlog import Batch, Checkpoint, Claim, Events, LogState, Remembered, StoreRunLog

if TYPE_CHECKING:
    import asyncpg

    Pool = asyncpg.Pool[asyncpg.Record]

EVENTS_CHANNEL = "antwort_events"
HANDOVER_CHANNEL = "antwort_handover"

_HELD = "id = $1 AND lease_instance = $2 AND NOT ended"
_APPEND = f"""WITH held AS (
        UPDATE antwort_runs SET last_seq = coalesce($3, last_seq), log_bytes = log_bytes + $4,
            ended = $5, expires_at = $6, cp_response = coalesce($9, cp_response),
            cp_turn = coalesce($10, cp_turn), cp_round = coalesce($11, cp_round), cp_seq = coalesce($12, cp_seq)
        WHERE {_HELD} RETURNING truncated),
    added AS (
        INSERT INTO antwort_events (response_id, seq, event)
        SELECT $1, s, e FROM unnest($7::int[], $8::bytea[]) AS t (s, e)
        WHERE EXISTS (SELECT 1 FROM held WHERE NOT truncated)
        ON CONFLICT DO NOTHING)
    SELECT pg_notify('{EVENTS_CHANNEL}', $1) FROM held"""
_CLAIM = """UPDATE antwort_runs AS r SET lease_instance = $1, lease_until = $2, handed_over = FALSE
    FROM (SELECT id, handed_over FROM antwort_runs WHERE NOT ended AND lease_until <= $3 AND lease_instance <> $1
          ORDER BY lease_until LIMIT $4 FOR UPDATE SKIP LOCKED) AS open
    WHERE r.id = open.id
    RETURNING r.id, r.owner, r.request, r.last_seq, open.handed_over, r.cp_response, r.cp_turn, r.cp_round,
        r.cp_seq"""


class PostgresRunLog(StoreRunLog):
    def __init__(self, pool: Pool, options: StoreOptions) -> None:
        super().__init__(options)
        self.pool = pool

    # Listeners on the store's session connection (postgres.py adds them).
    def events_notified(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        self.watchers.tell(str(payload))

    def handover_notified(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        if str(payload) != self._me:
            self.watchers.handed_over()

    async def begin(self, response_id: str, owner: str, request: bytes, lease: float) -> None:
        await self.pool.execute(
            """INSERT INTO antwort_runs (id, owner, request, lease_instance, lease_until) VALUES ($1, $2, $3, $4, $5)
               ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, request = excluded.request,
                   lease_instance = excluded.lease_instance, lease_until = excluded.lease_until""",
            response_id,
            owner,
            request,
            self._me,
            self.options.clock() + lease,
        )

    async def _write(self, batch: Batch) -> bool:
        cp, events = batch.checkpoint, batch.events
        held = await self.pool.fetchrow(
            _APPEND,
            batch.response_id,
            self._me,
            batch.last,
            batch.size,
            batch.ended,
            batch.expires_at,
            [seq for seq, _ in events],
            [data for _, data in events],
            cp.response if cp else None,
            cp.turn if cp else None,
            cp.round if cp else None,
            cp.sequence_number if cp else None,
        )
        return held is not None

    async def truncate(self, response_id: str) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute("UPDATE antwort_runs SET truncated = TRUE WHERE id = $1", response_id)
            await conn.execute("DELETE FROM antwort_events WHERE response_id = $1", response_id)

    async def checkpoint(self, response_id: str, checkpoint: Checkpoint) -> bool:
        status: str = await self.pool.execute(
            f"UPDATE antwort_runs SET cp_response = $3, cp_turn = $4, cp_round = $5, cp_seq = $6 WHERE {_HELD}",
            response_id,
            self._me,
            checkpoint.response,
            checkpoint.turn,
            checkpoint.round,
            checkpoint.sequence_number,
        )
        return status != "UPDATE 0"

    async def state(self, response_id: str, owner: str) -> LogState | None:
        found = await self.pool.fetchrow(
            "SELECT last_seq, ended, truncated, expires_at, log_bytes FROM antwort_runs WHERE id = $1 AND owner = $2",
            response_id,
            owner,
        )
        if found is None:
            return None
        expires = found["expires_at"]
        expired = expires is not None and expires <= self.options.clock()
        return LogState(found["last_seq"], found["ended"], found["truncated"], expired, found["log_bytes"])

    async def events(self, response_id: str, after: int, limit: int) -> Events:
        rows = await self.pool.fetch(
            "SELECT seq, event FROM antwort_events WHERE response_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
            response_id,
            after,
            limit,
        )
        return [(row["seq"], row["event"]) for row in rows]

    async def renew(self, response_ids: list[str], lease: float) -> list[str]:
        if not response_ids:
            return []
        kept = await self.pool.fetch(
            "UPDATE antwort_runs SET lease_until = $3 WHERE id = ANY($1) AND lease_instance = $2 AND NOT ended"
            " RETURNING id",
            response_ids,
            self._me,
            self.options.clock() + lease,
        )
        held = {row["id"] for row in kept}
        return [i for i in response_ids if i not in held]

    async def release(self, response_ids: list[str]) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "UPDATE antwort_runs SET lease_until = 0, handed_over = TRUE"
                " WHERE id = ANY($1) AND lease_instance = $2 AND NOT ended",
                response_ids,
                self._me,
            )
            await conn.execute("SELECT pg_notify($1, $2)", HANDOVER_CHANNEL, self._me)

    async def claim(self, lease: float, limit: int) -> list[Claim]:
        now = self.options.clock()
        async with self.pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(_CLAIM, self._me, now + lease, now, limit)
            claims = []
            for row in rows:
                response = row["cp_response"]
                checkpoint = None
                if response is not None:
                    checkpoint = Checkpoint(response, row["cp_turn"], row["cp_round"], row["cp_seq"])
                tail = await conn.fetch(
                    "SELECT event FROM antwort_events WHERE response_id = $1 AND seq > $2 ORDER BY seq",
                    row["id"],
                    checkpoint.sequence_number if checkpoint else 0,
                )
                claims.append(
                    Claim(
                        row["id"],
                        row["owner"],
                        row["request"],
                        checkpoint,
                        row["last_seq"],
                        row["handed_over"],
                        [t["event"] for t in tail],
                    )
                )
        return claims

    async def next_expiry(self) -> float | None:
        now = self.options.clock()
        first: float | None = await self.pool.fetchval(
            "SELECT min(lease_until) FROM antwort_runs WHERE NOT ended AND lease_until > $1 AND lease_instance <> $2",
            now,
            self._me,
        )
        return None if first is None else first - now

    async def remember(self, owner: str, key: str, digest: str, response_id: str, ttl: float) -> Remembered | None:
        now = self.options.clock()
        async with self.pool.acquire() as conn, conn.transaction():
            # Two creates with one key at once: the second waits for the first's row, then reads it.
            inserted = await conn.fetchval(
                """INSERT INTO antwort_idempotency (owner, key, digest, response_id, expires_at)
                   VALUES ($1, $2, $3, $4, $5)
                   ON CONFLICT (owner, key) DO UPDATE SET digest = excluded.digest,
                       response_id = excluded.response_id, expires_at = excluded.expires_at
                   WHERE antwort_idempotency.expires_at <= $6
                   RETURNING response_id""",
                owner,
                key,
                digest,
                response_id,
                now + ttl,
                now,
            )
            if inserted is not None:
                return None
            found = await conn.fetchrow(
                "SELECT response_id, digest FROM antwort_idempotency WHERE owner = $1 AND key = $2", owner, key
            )
        assert found is not None, "the row the insert conflicted with"
        return Remembered(found["response_id"], found["digest"])

    async def forget(self, owner: str, key: str) -> None:
        await self.pool.execute("DELETE FROM antwort_idempotency WHERE owner = $1 AND key = $2", owner, key)

    async def purge_logs(self) -> int:
        now = self.options.clock()
        async with self.pool.acquire() as conn, conn.transaction():
            gone = await conn.fetch("DELETE FROM antwort_runs WHERE expires_at <= $1 RETURNING id", now)
            await conn.execute("DELETE FROM antwort_events WHERE response_id = ANY($1)", [r["id"] for r in gone])
            keys: str = await conn.execute("DELETE FROM antwort_idempotency WHERE expires_at <= $1", now)
        return len(gone) + int(keys.split()[-1])
