"""A model call running in a task the run owns (model_call.py makes and reads them)."""

from __future__ import annotations

import asyncio

from antwort_grpc.engine.channel import Channel


class ModelCall:
    """One call of the model for one turn, running in a task of its own."""

    __slots__ = ("answered", "channel", "streaming", "task")

    def __init__(self, task: asyncio.Task[None], channel: Channel, streaming: bool) -> None:
        self.task = task
        # What the call delivers: streaming, the deltas as they arrive (then a TurnEnd, an
        # exception, or the end of the stream); else the Completion or the exception.
        self.channel = channel
        self.streaming = streaming
        # A before-model hook's answer, not the model's.
        self.answered = False

    def let_finish(self) -> None:
        """Its answer was read to the end: it only closes its stream now, and ends by itself.
        Whatever that raises is taken (and dropped): the answer is already the run's."""
        if not self.task.done():
            self.task.add_done_callback(_taken)

    async def discard(self) -> None:
        """Abandon it unread (the run stopped, failed or was steered before reading it)."""
        task = self.task
        if task.done():
            return  # it hands every failure to the channel: nothing left to retrieve
        task.cancel()
        # gather, not `await task`: the caller's own cancellation still propagates, and the
        # call's cancellation is not mistaken for it.
        await asyncio.gather(task, return_exceptions=True)


def _taken(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()
