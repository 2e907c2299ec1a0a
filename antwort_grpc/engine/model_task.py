"""A model call running in a task the run owns (model_call.py makes and reads them)."""

from __future__ import annotations

import asyncio


class ModelCall:
    """One call of the model for one turn, running in a task of its own."""

    __slots__ = ("answered", "queue", "task")

    def __init__(self, task: asyncio.Task[object], queue: asyncio.Queue[object] | None = None) -> None:
        self.task = task
        # Streaming: the deltas as they arrive (then a TurnEnd, an exception, or _ENDED).
        self.queue = queue
        # A before-model hook's answer, not the model's.
        self.answered = False

    @property
    def streaming(self) -> bool:
        return self.queue is not None

    async def discard(self) -> None:
        """Abandon it unread (the run stopped, failed or was steered before reading it)."""
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
