"""The memory store's RunLog: the same semantics as SQLite's and PostgreSQL's, in dicts (tests;
gateways sharing one MemoryDatabase stand for replicas sharing a database)."""

from __future__ import annotations

from dataclasses import dataclass, field

from antwort_grpc.storage.options import StoreOptions
from antwort_grpc.storage.runlog import Batch, Checkpoint, Claim, Events, LogState, Remembered, StoreRunLog, Watchers


@dataclass(slots=True)
class _Run:
    owner: str
    request: bytes
    lease_instance: str
    lease_until: float
    events: list[tuple[int, bytes]] = field(default_factory=list)
    last_seq: int = 0
    log_bytes: int = 0
    truncated: bool = False
    ended: bool = False
    expires_at: float | None = None
    checkpoint: Checkpoint | None = None
    handed_over: bool = False


@dataclass(slots=True)
class _Key:
    digest: str
    response_id: str
    expires_at: float


@dataclass(slots=True)
class RunTables:
    runs: dict[str, _Run] = field(default_factory=dict)
    keys: dict[tuple[str, str], _Key] = field(default_factory=dict)
    watchers: Watchers = field(default_factory=Watchers)

    def resumable(self, response_id: str) -> bool:
        """A background run not ended: some replica will resume it (never marked interrupted)."""
        run = self.runs.get(response_id)
        return run is not None and not run.ended


class MemoryRunLog(StoreRunLog):
    def __init__(self, tables: RunTables, options: StoreOptions) -> None:
        super().__init__(options, tables.watchers)
        self.tables = tables

    async def begin(self, response_id: str, owner: str, request: bytes, lease: float) -> None:
        self.tables.runs[response_id] = _Run(owner, request, self._me, self.options.clock() + lease)

    def _held(self, response_id: str) -> _Run | None:
        run = self.tables.runs.get(response_id)
        return run if run is not None and run.lease_instance == self._me and not run.ended else None

    async def _write(self, batch: Batch) -> bool:
        run = self._held(batch.response_id)
        if run is None:
            return False
        if batch.checkpoint is not None:
            run.checkpoint = batch.checkpoint
        if not run.truncated:
            run.events += batch.events
        if batch.last is not None:
            run.last_seq = batch.last
            run.log_bytes += batch.size
        if batch.ended:
            run.ended = True
            run.expires_at = batch.expires_at
        return True

    async def truncate(self, response_id: str) -> None:
        run = self.tables.runs.get(response_id)
        if run is not None:
            run.truncated = True
            run.events = []

    async def checkpoint(self, response_id: str, checkpoint: Checkpoint) -> bool:
        run = self._held(response_id)
        if run is None:
            return False
        run.checkpoint = checkpoint
        return True

    async def state(self, response_id: str, owner: str) -> LogState | None:
        run = self.tables.runs.get(response_id)
        if run is None or run.owner != owner:
            return None
        expired = run.expires_at is not None and run.expires_at <= self.options.clock()
        return LogState(run.last_seq, run.ended, run.truncated, expired, run.log_bytes)

    async def events(self, response_id: str, after: int, limit: int) -> Events:
        run = self.tables.runs.get(response_id)
        if run is None or not run.events:
            return []
        # Sequence numbers are dense from the first event kept.
        start = max(0, after - run.events[0][0] + 1)
        return run.events[start : start + limit]

    async def renew(self, response_ids: list[str], lease: float) -> list[str]:
        lost = []
        until = self.options.clock() + lease
        for response_id in response_ids:
            run = self._held(response_id)
            if run is None:
                lost.append(response_id)
            else:
                run.lease_until = until
        return lost

    async def release(self, response_ids: list[str]) -> None:
        for response_id in response_ids:
            run = self._held(response_id)
            if run is not None:
                run.lease_until = 0.0
                run.handed_over = True
        self.watchers.handed_over()

    async def claim(self, lease: float, limit: int) -> list[Claim]:
        now = self.options.clock()
        claims: list[Claim] = []
        for response_id, run in self.tables.runs.items():
            if len(claims) >= limit:
                break
            # Never its own: fencing tells replicas apart by instance, not by claim.
            if run.ended or run.lease_until > now or run.lease_instance == self._me:
                continue
            handed_over = run.handed_over
            run.lease_instance, run.lease_until, run.handed_over = self._me, now + lease, False
            after = run.checkpoint.sequence_number if run.checkpoint else 0
            tail = [data for seq, data in run.events if seq > after]
            claims.append(Claim(response_id, run.owner, run.request, run.checkpoint, run.last_seq, handed_over, tail))
        return claims

    async def next_expiry(self) -> float | None:
        now = self.options.clock()
        leases = [
            r.lease_until
            for r in self.tables.runs.values()
            if not r.ended and r.lease_instance != self._me and r.lease_until > now
        ]
        return min(leases) - now if leases else None

    async def remember(self, owner: str, key: str, digest: str, response_id: str, ttl: float) -> Remembered | None:
        now = self.options.clock()
        found = self.tables.keys.get((owner, key))
        if found is not None and found.expires_at > now:
            return Remembered(found.response_id, found.digest)
        self.tables.keys[(owner, key)] = _Key(digest, response_id, now + ttl)
        return None

    async def forget(self, owner: str, key: str) -> None:
        self.tables.keys.pop((owner, key), None)

    async def purge_logs(self) -> int:
        now = self.options.clock()
        gone = [i for i, r in self.tables.runs.items() if r.expires_at is not None and r.expires_at <= now]
        for response_id in gone:
            run = self.tables.runs[response_id]
            run.events = []
        keys = [k for k, v in self.tables.keys.items() if v.expires_at <= now]
        for k in keys:
            del self.tables.keys[k]
        return len(gone) + len(keys)
