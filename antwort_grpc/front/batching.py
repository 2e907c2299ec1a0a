"""Batched events (a request's `batch_events`): the events a run produces at the same moment leave
in one message. A message costs the gateway a full trip through grpc's core (the write's batch,
its completion on the poller thread, the loop woken to resolve it): at concurrency 1 that is most
of a streamed response's CPU (bench/RESULTS.md, "Streaming cost, round two").

"At the same moment" is read off the run itself, not from a list of event kinds: the events it
yields without waiting for anything (the model, a tool, a control, the store). The generator is
stepped by hand: each step runs it until it yields an event (that event joins the batch) or until
it waits (the batch leaves, and the wait is handed to the task as if the generator had been
awaited directly: a cancellation reaches it where it waits).

A batch leaves in more than one message when its events together exceed BATCH_BYTES: a client
that receives every event in a message of its own (gRPC's default limit is 4 MiB a message) then
receives the batched stream too. created and in_progress each echo the request's instructions and
tools; the done events of a long answer each carry its whole text.

Known limit: the batch is written while the run already waits. A wait the run makes under
`asyncio.timeout` cancels the task when it expires; should that happen while a write is still
blocked (a client that has not read for the whole timeout), the cancellation lands in the write
instead of the run's wait, and the response ends as if the client had gone. The run's own waits
time out by a timer on their channel instead (an approval's timeout: `Run.wait_for_control`); a
hook's timeout (hooks/dispatch.py) is still asyncio.timeout. Unbatched, the run does not start a
wait until the write is done.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Generator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

# The most bytes of events one batched message holds, unless a single event is larger (that one
# leaves alone, as it would unbatched).
BATCH_BYTES = 1024 * 1024


def parted(wires: Sequence[bytes], limit: int) -> list[list[bytes]]:
    """`wires` in order, in runs of at most `limit` bytes together (a longer one alone)."""
    parts: list[list[bytes]] = []
    part: list[bytes] = []
    size = 0
    for wire in wires:
        if part and size + len(wire) > limit:
            parts.append(part)
            part, size = [], 0
        part.append(wire)
        size += len(wire)
    if part:
        parts.append(part)
    return parts


class _Resumed:
    """Awaits the rest of a step of an async generator that waits on `waiting` (what its `send`
    returned): `waiting` goes up to the task, and whatever the task sends or throws back goes down
    to the step, as `await step` would have done. With `error`, that is thrown in first."""

    __slots__ = ("error", "step", "waiting")

    def __init__(self, step: Any, waiting: Any, error: BaseException | None = None) -> None:
        self.step = step
        self.waiting = waiting
        self.error = error

    def __await__(self) -> Generator[Any, Any, Any]:
        step, waiting, error = self.step, self.waiting, self.error
        while True:
            sent = None
            if error is None:
                try:
                    sent = yield waiting
                except BaseException as thrown:  # a cancellation, thrown in by the task
                    error = thrown
            try:
                waiting = step.send(sent) if error is None else step.throw(error)
            except StopIteration as done:
                return done.value
            error = None


async def batches(
    source: AsyncGenerator[T, None], holds: Callable[[], bool], last: Callable[[T], bool]
) -> AsyncGenerator[list[T], None]:
    """The items of `source` in lists, each list what it yielded without waiting in between.
    While `holds()` is true a wait does not end the list (the run has ended, and what is left
    before its terminal event is storing it); an item for which `last(item)` is true ends it."""
    batch: list[T] = []
    while True:
        step: Any = source.__anext__()
        try:
            waiting = step.send(None)
        except StopIteration as ready:
            batch.append(ready.value)
            if last(ready.value):
                yield batch
                batch = []
            continue
        except StopAsyncIteration:
            break
        if batch and not holds():
            try:
                yield batch
            except BaseException:
                # The consumer is gone (its write failed, its task was cancelled): the wait the
                # source is in ends as a cancellation of the task would have ended it.
                await _abandon(step, waiting)
                raise
            batch = []
        try:
            item = await _Resumed(step, waiting)
        except StopAsyncIteration:
            break
        batch.append(item)
        if last(item):
            yield batch
            batch = []
    if batch:
        yield batch


async def _abandon(step: Any, waiting: Any) -> None:
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await _Resumed(step, waiting, asyncio.CancelledError())
