"""Responses running in this process, so CancelResponse (or a deadline) can stop them.

Stopping is cooperative with one exception: while the loop awaits the model or its tools (an
"interruptible" wait), the running task is cancelled outright so a slow backend or tool is
abandoned at once. Anywhere else (while an event is being written to the client) only a flag is
set, and the loop stops at its next check; this keeps a cancel from tearing a half-written
message.
"""

from __future__ import annotations

import asyncio

from antwort_grpc import pb


class RunHandle:
    __slots__ = ("_timer", "done", "interruptible", "owner", "reason", "response", "task")

    def __init__(self, response: pb.Response, task: asyncio.Task[object] | None, owner: str = "") -> None:
        # The live Response being built (also for store=false responses, which are never saved).
        self.response = response
        self.task = task
        # Who started it: only they may read or cancel it.
        self.owner = owner
        self.done = asyncio.Event()
        # "cancelled" or "deadline" once a stop was asked for.
        self.reason = ""
        self.interruptible = False
        self._timer: asyncio.TimerHandle | None = None

    @property
    def response_id(self) -> str:
        return self.response.id

    @property
    def stop_requested(self) -> bool:
        return bool(self.reason)

    def stop(self, reason: str = "cancelled") -> None:
        if self.reason:
            return
        self.reason = reason
        if self.interruptible and self.task is not None:
            self.task.cancel()

    def set_deadline(self, when: float) -> None:
        self._timer = asyncio.get_running_loop().call_at(when, self.stop, "deadline")

    def clear(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def waiting(self) -> RunHandle:
        """Mark an await on the model or tools as one a stop may interrupt: `with handle.waiting():`.

        The handle is its own context manager: this runs once per streamed delta, and a
        generator-based one costs several times as much."""
        return self

    def __enter__(self) -> None:
        self.interruptible = True

    def __exit__(self, *exc: object) -> None:
        self.interruptible = False


class RunRegistry:
    def __init__(self) -> None:
        self._runs: dict[str, RunHandle] = {}

    def start(self, response: pb.Response, owner: str = "") -> RunHandle:
        handle = RunHandle(response, asyncio.current_task(), owner)
        self._runs[response.id] = handle
        return handle

    def finish(self, handle: RunHandle) -> None:
        handle.clear()
        self._runs.pop(handle.response_id, None)
        handle.done.set()

    def get(self, response_id: str, owner: str | None = None) -> RunHandle | None:
        """The run, if it runs here (and, when `owner` is given, belongs to them)."""
        handle = self._runs.get(response_id)
        if handle is None or (owner is not None and handle.owner != owner):
            return None
        return handle

    def stop(self, response_id: str, reason: str = "cancelled") -> bool:
        handle = self._runs.get(response_id)
        if handle is None:
            return False
        handle.stop(reason)
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
