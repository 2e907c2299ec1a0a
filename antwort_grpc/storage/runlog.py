"""What a store keeps of a background response besides the response itself — four small
protocols, each implemented by the memory, SQLite and PostgreSQL stores (runlog_*.py): its event
log, its last checkpoint, the lease of the replica running it, and the idempotency keys of creates.

- The event log: every event in sequence (protobuf bytes), appended in batches by the replica
  running the response; read by AttachResponse on any replica. It is kept for a retention after
  the end; beyond a size cap per response only the final response is kept (the log says so).
- The checkpoint: the Response as it stood at the last turn boundary, the turn and round counters
  and the sequence number then; a replica that takes the run over resumes from it.
- The lease: which replica runs it, until when. The runner renews it; a replica that finds it
  expired claims the run and resumes it. Every append and checkpoint is fenced by it: a replica
  that lost its lease (it was partitioned, then came back) writes nothing more.
- Idempotency keys: (owner, key) → the response a create with that key started, and a digest of
  that create, for a day.

The memory store keeps all of it in its MemoryDatabase (tests, one process); SQLite in its file
(one gateway: after a restart it resumes what the previous process left); PostgreSQL for
replicas, with LISTEN/NOTIFY telling attached readers on every replica that events were appended.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from antwort_grpc.storage.options import StoreOptions

# Why a run changed replica: its lease ran out (the replica died or hung), or its replica shut
# down and handed it over.
REPLICA_LOST = "replica_lost"
HANDED_OVER = "handed_over"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    # The Response at the turn boundary (serialized).
    response: bytes
    turn: int
    round: int
    # The sequence number of the last event before the boundary.
    sequence_number: int


@dataclass(frozen=True, slots=True)
class LogState:
    """What an attach needs to know about a response's log before reading it."""

    # The sequence number of the last event appended.
    last_sequence_number: int
    # The terminal event is in the log (nothing more will come).
    ended: bool
    # Over the size cap: the events were dropped, the final response is kept.
    truncated: bool
    # Past its retention: the events were dropped.
    expired: bool
    log_bytes: int = 0


@dataclass(slots=True)
class Claim:
    """A background run this replica took over."""

    response_id: str
    owner: str
    # The CreateResponseRequest that started it (serialized).
    request: bytes
    checkpoint: Checkpoint | None
    last_sequence_number: int
    # Its replica shut down and handed it over (else its lease ran out).
    handed_over: bool
    # The events after the checkpoint (serialized), in order: what the lost replica had begun.
    tail: list[bytes] = field(default_factory=list)

    @property
    def reason(self) -> str:
        return HANDED_OVER if self.handed_over else REPLICA_LOST


@dataclass(frozen=True, slots=True)
class Remembered:
    """The response an idempotency key already names, and the digest of the create that used it."""

    response_id: str
    digest: str


Events = list[tuple[int, bytes]]


@dataclass(frozen=True, slots=True)
class Batch:
    """One append as a store writes it: the events and what they change in the run's row."""

    response_id: str
    events: Events
    # The sequence number of the last event (None: no events, only a checkpoint or the end).
    last: int | None
    # The events' bytes, added to the log's size.
    size: int
    ended: bool
    # When an ended log may be dropped (None while the run goes on).
    expires_at: float | None
    checkpoint: Checkpoint | None


class EventLog(Protocol):
    """A background response's events, in sequence: appended by the replica running it (fenced by
    its lease), read by every attach on every replica."""

    async def append(
        self,
        response_id: str,
        events: Events,
        *,
        ended: bool = False,
        retention: float = 0,
        checkpoint: Checkpoint | None = None,
    ) -> bool:
        """Add events (sequence number, bytes) in order; `ended` with the terminal one, after which
        the log is kept `retention` seconds; `checkpoint` is kept with them, in the same write (a
        turn boundary costs one round trip). False (and nothing written) when this replica no
        longer holds the run's lease."""
        ...

    async def truncate(self, response_id: str) -> None:
        """The log went over its size cap: drop its events and say so to readers."""
        ...

    async def state(self, response_id: str, owner: str) -> LogState | None:
        """None: no background run (or idempotent create) of that id for that owner."""
        ...

    async def events(self, response_id: str, after: int, limit: int) -> Events:
        """Up to `limit` events after sequence number `after`, in order."""
        ...

    def watch(self, response_id: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` (on the event loop) whenever events are appended to that log, here or
        on another replica; returns the function that stops watching."""
        ...

    async def purge_logs(self) -> int:
        """Drop logs past their retention and keys past their time; how many (store upkeep)."""
        ...


class Checkpoints(Protocol):
    """The state a run resumes from (a turn boundary, or before a turn's tools run)."""

    async def checkpoint(self, response_id: str, checkpoint: Checkpoint) -> bool:
        """Keep the run's state; False when this replica lost the lease. (A checkpoint that goes
        with events is written by `EventLog.append`, in the same write.)"""
        ...


class Leases(Protocol):
    """Which replica runs which background response, until when; the takeover of lost ones."""

    async def begin(self, response_id: str, owner: str, request: bytes, lease: float) -> None:
        """A background run starts here, leased to this replica for `lease` seconds."""
        ...

    async def renew(self, response_ids: list[str], lease: float) -> list[str]:
        """Extend this replica's leases; the ids it no longer holds."""
        ...

    async def release(self, response_ids: list[str]) -> None:
        """Hand runs over at once (shutdown): their leases end now, and other replicas are told."""
        ...

    async def claim(self, lease: float, limit: int) -> list[Claim]:
        """Take over up to `limit` runs whose lease ran out (or was handed over)."""
        ...

    async def next_expiry(self) -> float | None:
        """Seconds until the first lease another replica holds on a running run runs out (None:
        none that has not run out already): the next look for lost runs is due then."""
        ...

    def on_handover(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` when some replica hands runs over (claim them now)."""
        ...


class IdempotencyKeys(Protocol):
    """(owner, key) → the response a create with that key started, and the create's digest."""

    async def remember(self, owner: str, key: str, digest: str, response_id: str, ttl: float) -> Remembered | None:
        """Bind an idempotency key to a response unless it is bound already; None when this call
        bound it, else what it was bound to."""
        ...

    async def forget(self, owner: str, key: str) -> None:
        """Unbind a key whose create failed before its response existed."""
        ...


@runtime_checkable
class RunLog(EventLog, Checkpoints, Leases, IdempotencyKeys, Protocol):
    """All four, as a store that keeps background runs offers them (`store.runlog`): one object,
    since an append is fenced by the lease and carries the checkpoint in the same write. Each
    user takes only the part it needs."""


class Watchers:
    """Who to tell that a log grew, by response id (the stores' shared part of `watch`)."""

    def __init__(self) -> None:
        self._by_id: dict[str, list[Callable[[], None]]] = {}
        self._handover: list[Callable[[], None]] = []

    def add(self, response_id: str, callback: Callable[[], None]) -> Callable[[], None]:
        self._by_id.setdefault(response_id, []).append(callback)

        def remove() -> None:
            callbacks = self._by_id.get(response_id)
            if callbacks is not None and callback in callbacks:
                callbacks.remove(callback)
                if not callbacks:
                    del self._by_id[response_id]

        return remove

    def tell(self, response_id: str) -> None:
        for callback in list(self._by_id.get(response_id, ())):
            callback()

    def add_handover(self, callback: Callable[[], None]) -> Callable[[], None]:
        self._handover.append(callback)

        def remove() -> None:
            if callback in self._handover:
                self._handover.remove(callback)

        return remove

    def handed_over(self) -> None:
        for callback in list(self._handover):
            callback()


class StoreRunLog(ABC):
    """What the memory, SQLite and PostgreSQL RunLogs share: the instance their leases name, the
    watchers in this process, and `append` but for the write itself, which each makes in one go."""

    def __init__(self, options: StoreOptions, watchers: Watchers | None = None) -> None:
        self.options = options
        # Whom to tell of appends and handovers here (the memory store's are its database's).
        self.watchers = watchers if watchers is not None else Watchers()

    @property
    def _me(self) -> str:
        return self.options.instance_id

    async def append(
        self,
        response_id: str,
        events: Events,
        *,
        ended: bool = False,
        retention: float = 0,
        checkpoint: Checkpoint | None = None,
    ) -> bool:
        """EventLog.append: the batch written, then this process's readers told."""
        last = events[-1][0] if events else None
        size = sum(len(data) for _, data in events)
        expires_at = self.options.clock() + retention if ended else None
        if not await self._write(Batch(response_id, events, last, size, ended, expires_at, checkpoint)):
            return False
        self.watchers.tell(response_id)
        return True

    @abstractmethod
    async def _write(self, batch: Batch) -> bool:
        """Write `batch` (events, counters, checkpoint) at once; False, and nothing written, when
        this replica no longer holds the run's lease."""

    def watch(self, response_id: str, callback: Callable[[], None]) -> Callable[[], None]:
        return self.watchers.add(response_id, callback)

    def on_handover(self, callback: Callable[[], None]) -> Callable[[], None]:
        return self.watchers.add_handover(callback)
