"""The background runs of this replica and the takeover of other replicas' lost ones: `Background`
starts runs (logged and leased), renews their leases, claims runs whose lease ran out (or that a
replica handed over) and resumes them through the engine; on shutdown it hands its runs over.
A plain (non-background) response never comes here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from antwort_grpc import pb
from antwort_grpc.durable.runner import Runner, snapshot
from antwort_grpc.durable.settings import DurableSettings
from antwort_grpc.engine import Engine
from antwort_grpc.engine.durable import Resumed
from antwort_grpc.engine.run import Run
from antwort_grpc.storage.base import RUNNING, ResponseStore, StoredResponse
from antwort_grpc.storage.runlog import Checkpoint, Checkpoints, Claim, EventLog, Leases

log = logging.getLogger(__name__)

# Looking for a lost run this long after its lease ran out: the claim compares `lease_until <= now`.
EXPIRY_MARGIN = 0.01


class Admits(Protocol):
    """What this replica lets run (the edge's admission and per-principal limits): a run taken
    over counts against them for as long as it runs here."""

    def room(self) -> int:
        """How many more runs could start here now."""
        ...

    def resumed(self, owner: str, request_bytes: int) -> Callable[[], None]:
        """Count a run taken over; what stops counting it."""
        ...


class Kept(EventLog, Checkpoints, Leases, Protocol):
    """What background runs need of the store's run log: all of it but the idempotency keys."""


class Background:
    """The background runs of this replica, and the takeover of other replicas' lost ones."""

    def __init__(
        self,
        engine: Engine,
        store: ResponseStore,
        runlog: Kept,
        settings: DurableSettings,
        admits: Admits | None = None,
    ) -> None:
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
        # The replica's admission (None: nothing is counted).
        self.admits = admits

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
        at = checkpoint.sequence_number if checkpoint is not None else 0
        resumed = Resumed(response, turn, round_, claim.last_sequence_number, claim.tail, claim.reason, at)
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
