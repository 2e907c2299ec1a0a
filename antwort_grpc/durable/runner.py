"""One background run on this replica: driven in a task of its own (no client connection owns it),
its events logged, its state checkpointed.

Its events go to the store's event log in batches: a task writes whatever queued while the last
write was in flight, so a write costs a batch, not an event. Readers (AttachResponse, the creating
stream) read the log, so every reader on every replica sees the same events with the same numbers.
At every turn boundary and before a turn's tool calls start, the run is checkpointed (the engine
calls `save`): the events so far and the Response with its counters, in one write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from antwort_grpc import pb
from antwort_grpc.durable.settings import DurableSettings
from antwort_grpc.engine.run import Run
from antwort_grpc.event_kinds import TERMINAL_EVENTS as TERMINAL
from antwort_grpc.storage.runlog import Checkpoint, EventLog

log = logging.getLogger(__name__)

# Seconds before a failed write of the log is tried again; the longest a run that ends (or is
# handed over) waits for its last events to be written.
RETRY_WRITE = 0.2
FINAL_WRITE = 5.0


class Abandoned(BaseException):
    """The run was handed over or its lease taken: it stops without ending (not an Exception, so
    the loop does not record it as the response's failure)."""


_Waiting = tuple[Checkpoint, "asyncio.Future[bool]"]


class Runner:
    """One background run here: drives it, logs its events, checkpoints it."""

    def __init__(self, run: Run, event_log: EventLog, settings: DurableSettings) -> None:
        self.run = run
        # Its events and checkpoints go here (a checkpoint with the events before it, in one write).
        self.event_log = event_log
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
            await self.event_log.truncate(self.response_id)
        try:
            held = await self.event_log.append(
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
