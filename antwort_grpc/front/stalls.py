"""Slow consumers: a stream whose client stops reading is ended after a bounded time.

A write blocks while the client does not read (gRPC's flow control, a full socket buffer for
HTTP); a client that never reads again would hold its stream, its response, its admission slot and
its memory for ever. Each stream is guarded while it runs: it marks when it writes and counts what
it wrote (two attribute stores per message, nothing more on the hot path); one sweeper task checks
every guard a few times per timeout and cancels the task of a stream whose write has not moved for
the whole timeout — as if the client had gone: its response stops and is stored with its final
status (`cancelled`), its slot is freed. A background response goes on; only that reader stops.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)


class Guard:
    """One stream's writes, as its sweeper sees them."""

    __slots__ = ("seen", "sent", "stalled", "task", "writing")

    def __init__(self, task: asyncio.Task[object] | None) -> None:
        self.task = task
        self.writing = False
        self.sent = 0
        self.seen = 0
        self.stalled = 0.0


class StallWatch:
    """The guards of every stream of this process and the one task that sweeps them."""

    def __init__(self, timeout: float) -> None:
        # Seconds a write may stay blocked before its stream is ended; 0: never.
        self.timeout = timeout
        self.guards: set[Guard] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self.ended = 0

    def guard(self) -> Guard:
        """A guard of the current task's stream, watched until `release` (with no timeout set, a
        guard nobody watches: the stream marks its writes all the same). Not a context manager:
        this is on every response's path."""
        guard = Guard(asyncio.current_task())
        if self.timeout:
            self.guards.add(guard)
            sweeper = self._sweeper
            if sweeper is None or sweeper.done():
                self._sweeper = asyncio.get_running_loop().create_task(self._sweep(), name="stalled streams")
        return guard

    def release(self, guard: Guard) -> None:
        self.guards.discard(guard)

    def sweep(self, interval: float) -> list[Guard]:
        """One look at every guard `interval` seconds after the last; the guards whose write has
        not moved for the whole timeout (their tasks cancelled)."""
        stalled = []
        for guard in self.guards:
            if not guard.writing or guard.sent != guard.seen:
                guard.seen, guard.stalled = guard.sent, 0.0
                continue
            guard.stalled += interval
            if guard.stalled >= self.timeout:
                stalled.append(guard)
        for guard in stalled:
            self.guards.discard(guard)
            self.ended += 1
            if guard.task is not None:
                guard.task.cancel()
        return stalled

    async def _sweep(self) -> None:
        interval = max(0.05, self.timeout / 4)
        while self.guards:
            await asyncio.sleep(interval)
            ended = self.sweep(interval)
            if ended:
                log.warning(
                    "ended %d stream(s) whose client read nothing for %g s (ANTWORT_STREAM_WRITE_TIMEOUT)",
                    len(ended),
                    self.timeout,
                )

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
