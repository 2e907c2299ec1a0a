"""Resuming a background run on another replica from its last checkpoint (a turn boundary).

What the lost replica did after the checkpoint is known from the event log's tail: the output
items it had begun there are superseded — the run's Response keeps them INCOMPLETE at their
output indexes (attached clients saw them added), those still open are closed by the resumed run
as incomplete, and the model never sees them. The model call in flight is made again. A
server-side call the checkpoint shows without an output may have been running: it runs again
only when its executor declares the tool idempotent; otherwise its output is an is_error saying
it was interrupted and not retried.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from antwort_grpc import pb
from antwort_grpc.engine.run import Continuation
from antwort_grpc.engine.tools import ToolSet

INCOMPLETE: int = pb.ItemStatus.ITEM_STATUS_INCOMPLETE
NOT_RETRIED = "the call was interrupted when the gateway replica running it stopped, and was not run again"


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


@dataclass(slots=True)
class Superseded:
    """The items the lost replica began after the checkpoint, by output index."""

    items: dict[int, pb.Item] = field(default_factory=dict)
    # Indexes of those whose output_item_done was never logged.
    still_open: list[int] = field(default_factory=list)
    # Turns the lost replica started after the checkpoint: they count (their model calls were
    # made), so turn numbers go on increasing.
    turns: int = 0


def superseded_items(tail: list[bytes], first_index: int) -> Superseded:
    """What the tail of the log (after the checkpoint) added at or after `first_index`."""
    found = Superseded()
    done: set[int] = set()
    for data in tail:
        event = pb.StreamEvent.FromString(data)
        which = event.WhichOneof("event")
        if which == "turn_started":
            found.turns += 1
        elif which == "output_item_added" and event.output_item_added.output_index >= first_index:
            found.items.setdefault(event.output_item_added.output_index, event.output_item_added.item)
        elif which == "output_item_done" and event.output_item_done.output_index >= first_index:
            found.items[event.output_item_done.output_index] = event.output_item_done.item
            done.add(event.output_item_done.output_index)
    found.still_open = sorted(set(found.items) - done)
    for item in found.items.values():
        item.status = INCOMPLETE  # type: ignore[assignment]
    return found


def interrupted_calls(output: list[pb.Item], tools: ToolSet) -> Continuation:
    """The server-side calls of the checkpoint without an output: idempotent ones run again, the
    others get an is_error output."""
    answered = {i.function_call_output.call_id for i in output if i.WhichOneof("kind") == "function_call_output"}
    resumed = Continuation()
    for item in output:
        if item.WhichOneof("kind") != "function_call" or item.function_call.call_id in answered:
            continue
        call = item.function_call
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
