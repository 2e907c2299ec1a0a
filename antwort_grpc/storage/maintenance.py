"""What the stores share besides rows: the periodic upkeep task (stopped with tasks.stop_task) and
the cancel subscribers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from antwort_grpc.storage.options import StoreOptions

log = logging.getLogger(__name__)

Step = Callable[[], Awaitable[object]]


def run_every(interval: float, steps: Sequence[Step], name: str) -> asyncio.Task[None]:
    """Run the steps in order every `interval` seconds until cancelled. A failing step is logged
    and retried next time: a database blip must not end the sweep or the purge for good."""

    async def loop() -> None:
        while True:
            await asyncio.sleep(interval)
            for step in steps:
                try:
                    await step()
                except Exception:
                    log.exception("%s: periodic step %s failed", name, getattr(step, "__name__", step))

    return asyncio.create_task(loop(), name=name)


async def start_upkeep(
    options: StoreOptions, steps: Sequence[Step], purge_expired: Step, name: str
) -> asyncio.Task[None]:
    """A durable store's upkeep (`run_every`). With a TTL, expired responses are purged now
    (what expired while no gateway ran) and on every pass after the other steps."""
    if options.ttl_seconds is not None:
        await purge_expired()
        steps = [*steps, purge_expired]
    return run_every(options.maintenance_interval, steps, name)


class CancelCallbacks:
    """Who to tell about a cancel request."""

    def __init__(self) -> None:
        self._callbacks: list[Callable[[str], object]] = []

    def add(self, callback: Callable[[str], object]) -> Callable[[], None]:
        self._callbacks.append(callback)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._callbacks.remove(callback)

        return remove

    def deliver(self, response_id: str) -> None:
        for callback in list(self._callbacks):
            try:
                callback(response_id)
            except Exception:
                log.exception("cancel callback failed for %s", response_id)
