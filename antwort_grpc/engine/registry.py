"""Responses running in this process, by id: what get, cancel and control reach, and what a
shutdown waits for."""

from __future__ import annotations

import asyncio

from antwort_grpc.engine.run import Run


class RunRegistry:
    def __init__(self) -> None:
        self._runs: dict[str, Run] = {}

    def add(self, run: Run) -> None:
        self._runs[run.response_id] = run

    def finish(self, run: Run) -> None:
        self._runs.pop(run.response_id, None)
        run.close()

    def get(self, response_id: str, owner: str | None = None) -> Run | None:
        """The run, if it runs here (and, when `owner` is given, belongs to them)."""
        run = self._runs.get(response_id)
        if run is None or (owner is not None and run.owner != owner):
            return None
        return run

    def stop(self, response_id: str, reason: str = "cancelled") -> bool:
        run = self._runs.get(response_id)
        if run is None:
            return False
        run.stop(reason)
        return True

    def running(self) -> list[str]:
        return list(self._runs)

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until every run has ended (and stored its final status); False on timeout."""
        try:
            async with asyncio.timeout(timeout):
                while self._runs:
                    await next(iter(self._runs.values())).done.wait()
        except TimeoutError:
            return False
        return True
