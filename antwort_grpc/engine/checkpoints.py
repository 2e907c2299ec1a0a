"""Where controls take effect between steps: a stop ends the run, a pause waits for resume, and
steering messages join the conversation (at a turn boundary); items added while the run goes on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from antwort_grpc import pb
from antwort_grpc.engine.run import Run

STEER: int = pb.InputKind.INPUT_KIND_STEER


async def checkpoint(run: Run, *, inject: bool = True) -> AsyncIterator[pb.StreamEvent]:
    """A stop ends the run here; a pause waits here for resume; steering messages join here
    (at a turn boundary)."""
    run.check()
    if run.pause_reason is not None:
        run.hooks.flush()
        yield run.emitter.paused(run.pause_reason)
        await run.hold_paused()
        yield run.emitter.resumed()
    if inject and run.steered:
        early = run.take_early()
        if early is not None:
            # Asked before the steering message came: the model must see it.
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
    run.append(emitter.turn_items)
    events.append(emitter.input_injected(kind, list(emitter.turn_items), run.take_superseded()))
    return events
