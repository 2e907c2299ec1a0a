"""Background responses: runs decoupled from the call that started them, logged, checkpointed,
leased, and taken over by another replica when theirs stops (docs/durable-runs.md).

- A `Runner` drives one run in a task of its own (no client connection owns it). Its events go
  to the store's event log in batches: a task writes whatever queued while the last write was in
  flight, so a write costs a batch, not an event. Readers (AttachResponse, the creating stream)
  read the log, so every reader on every replica sees the same events with the same numbers.
- At every turn boundary and before tool calls start, the run is checkpointed (engine/turn.py
  calls `save`): the events so far are flushed first, then the Response and the counters.
- `Background` renews the leases of the runs here, claims runs whose lease ran out (or that a
  replica handed over) and resumes them (engine.resume); on shutdown it hands its runs over.

A plain (non-background) response never comes here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from antwort_grpc import pb
from antwort_grpc.engine import Engine
from antwort_grpc.engine.durable import Resumed
from antwort_grpc.engine.run import Run
from antwort_grpc.event_kinds import TERMINAL_EVENTS as TERMINAL
from antwort_grpc.storage.base import RUNNING, ResponseStore, StoredResponse
from antwort_grpc.storage.runlog import Checkpoint, Claim, RunLog

log = logging.getLogger(__name__)

# Seconds before a failed write of the log is tried again; the longest a run that ends (or is
# handed over) waits for its last events to be written.
RETRY_WRITE = 0.2
FINAL_WRITE = 5.0
# Looking for a lost run this long after its lease ran out: the claim compares `lease_until <= now`.
EXPIRY_MARGIN = 0.01


@dataclass(frozen=True, slots=True)
class DurableSettings:
    # Seconds a replica holds a run without renewing; another takes it over after that.
    lease_seconds: float = 10.0
    # Seconds the event log is kept after the run ended.
    log_retention_seconds: float = 3600.0
    # Bytes of events one response's log may hold; beyond it only the final response is kept.
    log_max_bytes: int = 16 * 1024 * 1024
    # Seconds an idempotency key names its response.
    idempotency_ttl_seconds: float = 24 * 3600.0
    # Runs one replica claims in one look.
    claim_batch: int = 64

    @property
    def upkeep_interval(self) -> float:
        """Renew well before the lease runs out; look for lost runs as often."""
        return self.lease_seconds / 4


class Abandoned(BaseException):
    """The run was handed over or its lease taken: it stops without ending (not an Exception, so
    the loop does not record it as the response's failure)."""


_Waiting = tuple[Checkpoint, "asyncio.Future[bool]"]


class Runner:
    """One background run here: drives it, logs its events, checkpoints it."""

    def __init__(self, run: Run, runlog: RunLog, settings: DurableSettings) -> None:
        self.run = run
        self.runlog = runlog
        self.settings = settings
        self.response_id = run.response_id
        self._pending: list[tuple[int, bytes]] = []
        self._ended = False
        self._size = 0
        self._truncated = False
        # The last sequence number written to the log.
        self.written = 0
        self._wake = asyncio.Event()
        # Checkpoints waiting for the next write, and who waits for each.
        self._checkpoints: list[_Waiting] = []
        # The first event (and its bytes), for a non-streaming create to answer with at once.
        self.first: asyncio.Future[tuple[pb.StreamEvent, bytes]] = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task[None] | None = None
        self.lost = False
        self._closing = False
        # What the run holds while it runs here (admission room, a slot of its principal's
        # limit): given back when its terminal event is made (before any reader can see it in
        # the log) or when it stops here another way.
        self._holds: list[Callable[[], None]] = []
        self._let_go = False
        run.make_durable(self)

    def start(self) -> None:
        self.task = asyncio.create_task(self._drive(), name=f"background {self.response_id}")

    def hold(self, release: Callable[[], None]) -> None:
        """Call `release` once the run no longer runs here."""
        if self._let_go:
            release()
        else:
            self._holds.append(release)

    def _give_back(self) -> None:
        self._let_go = True
        holds, self._holds = self._holds, []
        for release in holds:
            release()

    async def _drive(self) -> None:
        writer = asyncio.create_task(self._write())
        try:
            async with contextlib.aclosing(self.run.events()) as events:
                async for event in events:
                    wire = self.run.take_wire(event) or event.SerializeToString()
                    if not self.first.done():
                        self.first.set_result((event, wire))
                    self._pending.append((event.sequence_number, wire))
                    if event.WhichOneof("event") in TERMINAL:
                        self._ended = True
                        self._give_back()
                    self._wake.set()
        except Abandoned:
            pass
        except Exception:
            log.exception("background response %s failed", self.response_id)
        finally:
            self._give_back()
            self._closing = True
            self._wake.set()
            # What was produced goes to the log, even on a handover (the new owner reads it);
            # a store that stays down does not hold a shutdown for ever.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(FINAL_WRITE):
                    await asyncio.shield(writer)
            writer.cancel()

    async def _write(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = self._pending, []
            checkpoints, self._checkpoints = self._checkpoints, []
            # The terminal event is the run's last: once it was made, it is in this batch or an
            # earlier one, and nothing follows it.
            if (batch or checkpoints) and not await self._append(batch, checkpoints):
                return
            if self._closing and not self._pending:
                return

    async def _append(self, batch: list[tuple[int, bytes]], checkpoints: list[_Waiting]) -> bool:
        size = sum(len(data) for _, data in batch)
        self._size += size
        if not self._truncated and self._size > self.settings.log_max_bytes:
            self._truncated = True
            await self.runlog.truncate(self.response_id)
        try:
            held = await self.runlog.append(
                self.response_id,
                batch,
                ended=self._ended,
                retention=self.settings.log_retention_seconds,
                checkpoint=checkpoints[-1][0] if checkpoints else None,
            )
        except Exception:
            # A database blip: the batch goes first into the next write (readers must never see
            # a gap), tried again shortly.
            log.exception("background response %s: writing its events failed; retrying", self.response_id)
            self._size -= size
            self._pending = batch + self._pending
            self._checkpoints = checkpoints + self._checkpoints
            await asyncio.sleep(RETRY_WRITE)
            self._wake.set()
            return True
        for _, waiting in checkpoints:
            waiting.set_result(held)
        if not held:
            self._lose()
            return False
        if batch:
            self.written = batch[-1][0]
        return True

    def _lose(self) -> None:
        """Another replica holds the run now: stop without ending it."""
        if not self.lost:
            self.lost = True
            log.warning("background response %s: lease lost, another replica runs it", self.response_id)
            self.run.abandon()
            if self.task is not None:
                self.task.cancel()

    async def save(self, run: Run) -> None:
        """A checkpoint (engine/turn.py), written with the events before it in one write."""
        checkpoint = Checkpoint(run.response.SerializeToString(), run.turn, run.round, run.emitter.sequence_number)
        waiting: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._checkpoints.append((checkpoint, waiting))
        self._wake.set()
        if self.lost or not await waiting:
            self._lose()
            raise Abandoned

    async def hand_over(self) -> None:
        """Stop here without ending; what was produced is written first."""
        self.run.abandon()
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Abandoned):
                await self.task


class Admits(Protocol):
    """What this replica lets run (the edge's admission and per-principal limits): a run taken
    over counts against them for as long as it runs here."""

    def room(self) -> int:
        """How many more runs could start here now."""
        ...

    def resumed(self, owner: str, request_bytes: int) -> Callable[[], None]:
        """Count a run taken over; what stops counting it."""
        ...


class Background:
    """The background runs of this replica, and the takeover of other replicas' lost ones."""

    def __init__(self, engine: Engine, store: ResponseStore, runlog: RunLog, settings: DurableSettings) -> None:
        self.engine = engine
        self.store = store
        self.runlog = runlog
        self.settings = settings
        self.runners: dict[str, Runner] = {}
        self._task: asyncio.Task[None] | None = None
        self._look = asyncio.Event()
        self._unsubscribe: Callable[[], None] | None = None
        self.stopping = False
        # Called with each resumed run (tests and metrics watch takeovers).
        self.resumed: list[str] = []
        # The replica's admission (set by the core; None: nothing is counted).
        self.admits: Admits | None = None

    async def begin(self, run: Run) -> Runner:
        """Log and lease a new background run (stored already), then start it."""
        await self.runlog.begin(
            run.response_id, run.owner, run.request.SerializeToString(), self.settings.lease_seconds
        )
        # The run's state before any turn: what a replica resumes if this one dies at once.
        initial = Checkpoint(run.response.SerializeToString(), 0, 0, 0)
        await self.runlog.checkpoint(run.response_id, initial)
        return self._start(run)

    def _start(self, run: Run, release: Callable[[], None] | None = None) -> Runner:
        """`release`: what the run holds of the admission, given back when it ends here."""
        runner = Runner(run, self.runlog, self.settings)
        self.runners[run.response_id] = runner
        runner.start()
        assert runner.task is not None
        runner.task.add_done_callback(lambda _: self._forget(runner))
        if release is not None:
            runner.hold(release)
        return runner

    def _forget(self, runner: Runner) -> None:
        if self.runners.get(runner.response_id) is runner:
            del self.runners[runner.response_id]

    # -- upkeep: leases and takeover ----------------------------------------------------------------

    def start(self) -> None:
        self._unsubscribe = self.runlog.on_handover(self._look.set)
        self._task = asyncio.create_task(self._upkeep(), name="background-upkeep")
        self._look.set()  # at start: what a previous process (or a dead replica) left

    async def _upkeep(self) -> None:
        wait = self.settings.upkeep_interval
        while not self.stopping:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._look.wait()
            self._look.clear()
            wait = self.settings.upkeep_interval
            try:
                await self.renew()
                await self.take_over()
                wait = await self.next_look()
            except Exception:
                log.exception("background upkeep failed; retried")

    async def next_look(self) -> float:
        """Seconds to the next look: a quarter lease, or sooner when a lease another replica holds
        runs out before that — so a run whose replica died is taken over as its lease ends (at
        most one lease after the crash: the last renewal was before it), not up to a quarter
        lease later."""
        interval = self.settings.upkeep_interval
        expiry = await self.runlog.next_expiry()
        if expiry is None:
            return interval
        return min(interval, expiry + EXPIRY_MARGIN)

    async def renew(self) -> None:
        lost = await self.runlog.renew(list(self.runners), self.settings.lease_seconds)
        for response_id in lost:
            runner = self.runners.get(response_id)
            if runner is not None:
                runner._lose()

    async def take_over(self) -> int:
        """Claim and resume the runs whose replica is gone; how many. A replica at its running
        cap claims none (and near it, only as many as fit): the others stay unclaimed, for
        another replica or this one's next look, rather than running over the cap."""
        if self.stopping:
            return 0
        room = self.settings.claim_batch
        if self.admits is not None:
            room = min(room, self.admits.room())
            if room <= 0:
                return 0
        claims = await self.runlog.claim(self.settings.lease_seconds, room)
        for claim in claims:
            try:
                await self._resume(claim)
            except Exception:
                log.exception("background response %s: resuming failed", claim.response_id)
        return len(claims)

    async def _resume(self, claim: Claim) -> None:
        record = await self.store.get(claim.response_id, claim.owner)
        if record is None:
            return  # deleted meanwhile
        if record.response.status not in RUNNING:
            await self._finish(claim, record)
            return
        release = self.admits.resumed(claim.owner, len(claim.request)) if self.admits is not None else None
        try:
            await self._restart(claim, record, release)
        except BaseException:
            if release is not None:
                release()
            raise

    async def _finish(self, claim: Claim, record: StoredResponse) -> None:
        """It ended, but its replica stopped before the terminal event reached the log: the log
        gets it now, from the stored response, and nothing runs again."""
        event = snapshot(record.response)
        event.sequence_number = claim.last_sequence_number + 1
        done = [(event.sequence_number, event.SerializeToString())]
        await self.runlog.append(claim.response_id, done, ended=True, retention=self.settings.log_retention_seconds)

    async def _restart(self, claim: Claim, record: StoredResponse, release: Callable[[], None] | None) -> None:
        checkpoint = claim.checkpoint
        response = record.response
        turn = round_ = 0
        if checkpoint is not None:
            response = pb.Response.FromString(checkpoint.response)
            turn, round_ = checkpoint.turn, checkpoint.round
        request = pb.CreateResponseRequest.FromString(claim.request)
        resumed = Resumed(response, turn, round_, claim.last_sequence_number, claim.tail, claim.reason)
        run = await self.engine.resume(request, record, resumed)
        log.info("background response %s resumed after turn %d (%s)", claim.response_id, turn, claim.reason)
        self.resumed.append(claim.response_id)
        self._start(run, release)

    async def hand_over(self) -> None:
        """Shutdown: every run here stops without ending, and its lease is given up at once so
        another replica resumes it now."""
        self.stopping = True
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        runners = list(self.runners.values())
        await asyncio.gather(*(r.hand_over() for r in runners), return_exceptions=True)
        if runners:
            await self.runlog.release([r.response_id for r in runners])
            log.info("handed %d background responses over", len(runners))


def snapshot(response: pb.Response) -> pb.StreamEvent:
    """A stored response as the one message of a non-streaming create: its terminal event once it
    ended, else `created`."""
    kinds = {
        pb.ResponseStatus.RESPONSE_STATUS_COMPLETED: "completed",
        pb.ResponseStatus.RESPONSE_STATUS_INCOMPLETE: "incomplete",
        pb.ResponseStatus.RESPONSE_STATUS_FAILED: "failed",
        pb.ResponseStatus.RESPONSE_STATUS_CANCELLED: "cancelled",
        pb.ResponseStatus.RESPONSE_STATUS_REQUIRES_ACTION: "requires_action",
    }
    event = pb.StreamEvent()
    getattr(event, kinds.get(response.status, "created")).response.CopyFrom(response)
    return event
