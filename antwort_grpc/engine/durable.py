"""Resuming a background run on another replica from its last checkpoint (a turn boundary, or
just before a turn's tool calls run).

What the lost replica did after the checkpoint is known from the event log's tail: the output
items it had begun there are superseded — the run's Response keeps them INCOMPLETE at their
output indexes, with the content their logged deltas gave them (attached clients saw it; the
text's log probabilities too, when the request asked for them), and the model never sees them.
The resumed run first closes what the lost replica left open, so the log stays one well-formed
stream: its open content parts and items (done, incomplete), its tool executions (failed:
interrupted), its turn (decided interrupted if it was not decided yet, then completed with the
`recovered` event's reason). The model call in flight is made again. A server-side call the
checkpoint shows without an output may have been running: it runs again only when its executor
declares the tool idempotent (its own executions then pair up); otherwise its output is an
is_error saying it was interrupted and not retried.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from antwort_grpc import pb
from antwort_grpc.engine.emitter import ResponseEmitter
from antwort_grpc.engine.run import Continuation
from antwort_grpc.engine.tools import ToolSet

INCOMPLETE: int = pb.ItemStatus.ITEM_STATUS_INCOMPLETE
INTERRUPTED: int = pb.TurnDecision.TURN_DECISION_INTERRUPTED
NOT_RETRIED = "the call was interrupted when the gateway replica running it stopped, and was not run again"
STOPPED = "interrupted: the gateway replica running the call stopped"


@dataclass(slots=True)
class Resumed:
    """A checkpoint, as a replica that takes the run over reads it."""

    # The Response at the checkpoint (the run goes on filling it in).
    response: pb.Response
    turn: int
    round: int
    # The last event in the log, and the events after the checkpoint (serialized).
    last_sequence_number: int
    tail: list[bytes]
    # Why the run changed replica (storage.runlog: replica_lost or handed_over).
    reason: str
    # The sequence number the checkpoint was taken at (0: the run's start, before any event).
    at: int = 0


@dataclass(slots=True)
class Superseded:
    """What the lost replica left after the checkpoint: the items it began, by output index, and
    what it left open."""

    items: dict[int, pb.Item] = field(default_factory=dict)
    # Indexes of those whose output_item_done was never logged, and of each the content part
    # left open (-1: none).
    still_open: dict[int, int] = field(default_factory=dict)
    # Turns the lost replica started after the checkpoint: they count (their model calls were
    # made), so turn numbers go on increasing.
    turns: int = 0
    # The turn left open (0: none), and whether its decision was logged.
    open_turn: int = 0
    decided: bool = False
    # Tool executions begun and never ended, by call id.
    running: dict[str, pb.ToolExecutionInProgressEvent] = field(default_factory=dict)


def unanswered(output: list[pb.Item]) -> list[pb.FunctionCall]:
    """The function calls of `output` without an output there."""
    answered = {i.function_call_output.call_id for i in output if i.WhichOneof("kind") == "function_call_output"}
    return [
        i.function_call
        for i in output
        if i.WhichOneof("kind") == "function_call" and i.function_call.call_id not in answered
    ]


def superseded_items(tail: list[bytes], first_index: int, open_turn: int = 0) -> Superseded:
    """What the tail of the log (after the checkpoint) added at or after `first_index`.
    `open_turn`: the turn the checkpoint was taken in, decided already (a checkpoint before its
    tools run), else 0."""
    found = Superseded(open_turn=open_turn, decided=bool(open_turn))
    for data in tail:
        _read(found, pb.StreamEvent.FromString(data), first_index)
    for item in found.items.values():
        item.status = INCOMPLETE  # type: ignore[assignment]
        item.superseded = True
    return found


def _read(found: Superseded, event: pb.StreamEvent, first_index: int) -> None:
    which = event.WhichOneof("event")
    if which in _TURNS:
        _TURNS[which](found, event)
    elif which in _TOOLS:
        call_id = getattr(event, which).call_id
        if which == "tool_execution_in_progress":
            found.running[call_id] = event.tool_execution_in_progress
        else:
            found.running.pop(call_id, None)
    elif which in _CONTENT:
        payload = getattr(event, which)
        if payload.output_index >= first_index:
            _CONTENT[which](found, payload)


def _turn_started(found: Superseded, event: pb.StreamEvent) -> None:
    found.turns += 1
    found.open_turn, found.decided = event.turn_started.turn, False


def _turn_decided(found: Superseded, event: pb.StreamEvent) -> None:
    found.decided = True


def _turn_completed(found: Superseded, event: pb.StreamEvent) -> None:
    found.open_turn, found.decided = 0, False


def _added(found: Superseded, payload: pb.OutputItemAddedEvent) -> None:
    if payload.output_index not in found.items:
        found.items[payload.output_index] = payload.item
        found.still_open[payload.output_index] = -1


def _done(found: Superseded, payload: pb.OutputItemDoneEvent) -> None:
    found.items[payload.output_index] = payload.item
    found.still_open.pop(payload.output_index, None)


def _part_added(found: Superseded, payload: pb.ContentPartAddedEvent) -> None:
    item = found.items.get(payload.output_index)
    if item is not None and payload.output_index in found.still_open:
        item.message.content.append(payload.part)
        found.still_open[payload.output_index] = payload.content_index


def _part_done(found: Superseded, payload: pb.ContentPartDoneEvent) -> None:
    item = found.items.get(payload.output_index)
    if item is not None and payload.output_index in found.still_open:
        item.message.content[payload.content_index].CopyFrom(payload.part)
        found.still_open[payload.output_index] = -1


def _open_item(found: Superseded, index: int) -> pb.Item | None:
    return found.items.get(index) if index in found.still_open else None


def _text(found: Superseded, payload: pb.OutputTextDeltaEvent) -> None:
    item = _open_item(found, payload.output_index)
    if item is not None and payload.content_index < len(item.message.content):
        text = item.message.content[payload.content_index].output_text
        text.text += payload.delta
        # Its tokens' log probabilities, when asked for: the part keeps them as the text.
        text.logprobs.extend(payload.logprobs)


def _refusal(found: Superseded, payload: pb.RefusalDeltaEvent) -> None:
    item = _open_item(found, payload.output_index)
    if item is not None and payload.content_index < len(item.message.content):
        item.message.content[payload.content_index].refusal.refusal += payload.delta


def _reasoning(found: Superseded, payload: pb.ReasoningTextDeltaEvent) -> None:
    item = _open_item(found, payload.output_index)
    if item is not None:
        item.reasoning.text += payload.delta


def _arguments(found: Superseded, payload: pb.FunctionCallArgumentsDeltaEvent) -> None:
    item = _open_item(found, payload.output_index)
    if item is not None:
        item.function_call.arguments += payload.delta


_TURNS: dict[str, Callable[[Superseded, pb.StreamEvent], None]] = {
    "turn_started": _turn_started,
    "turn_decided": _turn_decided,
    "turn_completed": _turn_completed,
}
_TOOLS = frozenset({"tool_execution_in_progress", "tool_execution_completed", "tool_execution_failed"})
# Each takes its event's payload (an item event, a part event or a delta).
_CONTENT: dict[str, Callable[[Superseded, Any], None]] = {
    "output_item_added": _added,
    "output_item_done": _done,
    "content_part_added": _part_added,
    "content_part_done": _part_done,
    "output_text_delta": _text,
    "refusal_delta": _refusal,
    "reasoning_text_delta": _reasoning,
    "function_call_arguments_delta": _arguments,
}


def recovery(emitter: ResponseEmitter, resumed: Resumed, superseded: Superseded) -> list[pb.StreamEvent]:
    """The resumed run's first events: `recovered`, then the closing of what the lost replica
    left open (its Response holds the superseded items at their indexes already)."""
    events = [emitter.recovered(resumed.last_sequence_number, resumed.turn, resumed.reason)]
    others = [index for index, part in sorted(superseded.still_open.items()) if not emitter.reopen(index, part)]
    events += emitter.close_turn(INCOMPLETE)
    events += [emitter.superseded(index) for index in others]
    emitter.start_turn()  # what it closed is not the model's: no turn reads it
    turn = superseded.open_turn
    if turn and not superseded.decided:
        events.append(emitter.turn_decided(turn, INTERRUPTED))
    events += [emitter.tool_interrupted(execution, STOPPED) for execution in superseded.running.values()]
    if turn:
        events.append(emitter.turn_completed(turn, 0.0, interrupted=resumed.reason))
    return events


def resumed_continuation(resumed: Resumed, started: Continuation, tools: ToolSet) -> Continuation:
    """What the resumed run starts with. `started`: what the response started with (a
    continuation of an earlier response's calls; the checkpoint's Response has no outputs for
    them yet when the run was lost before they ended). A checkpoint taken at the run's start
    (nothing logged) leaves them to go through their gates again, as at the start; a later one
    was taken when they had passed them and were about to run (or after), so they, and the
    checkpoint's own calls without an output (a turn's, checkpointed before they ran), may have
    run: `interrupted_calls`."""
    output = list(resumed.response.output)
    answered = {i.function_call_output.call_id for i in output if i.WhichOneof("kind") == "function_call_output"}
    calls = [c for c in started.calls if c.call_id not in answered]
    outputs = [o for o in started.outputs if o.call_id not in answered]
    if not resumed.at:
        return Continuation(calls, outputs, list(started.handoff), set(started.approved))
    again = interrupted_calls(calls + unanswered(output), tools)
    again.outputs = outputs + again.outputs
    again.handoff = list(started.handoff)
    return again


def interrupted_calls(calls: list[pb.FunctionCall], tools: ToolSet) -> Continuation:
    """Server-side calls that may have been running when the replica stopped: idempotent ones run
    again, the others get an is_error output."""
    resumed = Continuation()
    for call in calls:
        route = tools.routes.get(call.name)
        if route is None or route.executor is None:
            continue  # the client's to run: the response ended for it before any checkpoint
        idempotent = getattr(route.executor, "is_idempotent", None)
        if idempotent is not None and idempotent(call.name):
            resumed.calls.append(call)
            resumed.approved.add(call.call_id)  # it was past its gates when it was interrupted
        else:
            resumed.outputs.append(pb.FunctionCallOutput(call_id=call.call_id, output=NOT_RETRIED, is_error=True))
    return resumed
