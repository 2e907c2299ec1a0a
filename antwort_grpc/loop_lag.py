"""How far behind the event loop runs: what admission reads to refuse work the process cannot
serve now.

One process serves every stream on one event loop. Past what that loop can carry, every stream's
next token waits behind every other's (the held-streams bench: token lag p99 117 ms at 500 streams,
2.75 s at 1,000 on the 2-core host), and grpc stops taking calls in quickly enough. A timer that
should fire every TICK seconds measures how late it fires; the lag is a moving average of that,
so one slow moment does not refuse work, a loop that stays behind does."""

from __future__ import annotations

import asyncio
import contextlib

# A few looks a second: enough to follow a loop that stays behind, too few to cost anything.
TICK = 0.25
# The weight of the newest sample: about the last second counts.
WEIGHT = 0.3


class LoopLag:
    def __init__(self) -> None:
        # Seconds the loop runs behind, averaged.
        self.lag = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._measure(), name="loop lag")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def sample(self, late: float) -> None:
        self.lag += WEIGHT * (max(0.0, late) - self.lag)

    async def _measure(self) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                due = loop.time() + TICK
                await asyncio.sleep(TICK)
                self.sample(loop.time() - due)
