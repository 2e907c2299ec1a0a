"""Where controls take effect between steps: a stop ends the run, a pause waits for resume, and
steering messages join the conversation (at a turn boundary); items added while the run goes on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from antwort_grpc import pb
from antwort_grpc.engine.run import PAUSE, Run, Stopped

STEER: int = pb.InputKind.INPUT_KIND_STEER


async def checkpoint(run: Run, *, inject: bool = True) -> AsyncIterator[pb.StreamEvent]:
    """A stop ends the run here; a pause waits here for resume; steering messages join here
    (at a turn boundary)."""
    if run.reason:
        raise Stopped
    if run.pause_reason is not None:
        run.paused = True
        run.governor.flush()
        yield run.emitter.paused(run.pause_reason)
        while run.pause_reason is not None:
            run.waiting = PAUSE
            try:
                await run.wake()
            finally:
                run.waiting = None
        run.paused = False
        yield run.emitter.resumed()
    if inject and run.steer:
        if run.early is not None:
            # Asked before the steering message came: the model must see it.
            early, run.early = run.early, None
            await early.discard()
        for event in inject_items(run, STEER, run.take_steer()):
            yield event


def inject_items(run: Run, kind: int, items: list[pb.Item]) -> list[pb.StreamEvent]:
    """Items added to the conversation while it runs: output items of the response (so a
    continuation rebuilds the same context), announced by input_injected."""
    emitter = run.emitter
    emitter.start_turn()
    events: list[pb.StreamEvent] = []
    for item in items:
        events += emitter.add_item(item)
    run.context += emitter.turn_items
    events.append(emitter.input_injected(kind, list(emitter.turn_items), run.superseded))
    run.superseded = []
    return events
