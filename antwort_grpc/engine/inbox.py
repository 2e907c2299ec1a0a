"""A run's inbox: the controls that came for it and not yet acted on, and the bell that tells a
waiting run that one came. Private to its Run (engine/run.py): only the run's verbs read and
write it.

Controls never interrupt a task: `send` records what came and rings the bell of the wait the run
is in (if any). Every wait of a run reads one channel — a model call's deltas, tool results and
progress, a hook call's or a save's end, or a channel of its own — and the bell is one more
message on that channel, so a wait ends the moment a control arrives and the run decides what it
means where it is. Cancellation stays what it means in asyncio: the client went away, or the
server is shutting down.

What a control may add is bounded (budget.ControlLimits): items per control, steering messages and
follow-ups queued (count and bytes), and what the response may hold in all — the history cap, so
that the response can always be read back and continued.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence

import grpc

from antwort_grpc import pb
from antwort_grpc.engine.budget import ControlLimits
from antwort_grpc.engine.channel import Channel
from antwort_grpc.errors import FieldViolation, RequestError


class Inbox:
    """What came for a run. The run reads and takes; `send` (any task) only records and rings."""

    __slots__ = (
        "_bell",
        "_rang",
        "attention",
        "awaiting",
        "controller",
        "decisions",
        "follow_up_bytes",
        "follow_ups",
        "limits",
        "measure",
        "pause_reason",
        "paused",
        "steer_bytes",
        "steers",
        "stop_reason",
    )

    def __init__(self, controller: bool, limits: ControlLimits, measure: Callable[[], int]) -> None:
        # A client is attached that can decide approvals while the run waits (a Converse stream).
        self.controller = controller
        self.limits = limits
        # The bytes the response holds now (its input and output): what controls add counts on it.
        self.measure = measure
        # "cancelled", "deadline" or "max_duration" once a stop was asked for.
        self.stop_reason = ""
        # Something for the run to look at on its next check (a stop or a steer): one flag, read
        # once per streamed delta.
        self.attention = False
        # Steering messages and follow-ups waiting for the run (each control's items and bytes),
        # and their bytes together.
        self.steers: deque[tuple[list[pb.Item], int]] = deque()
        self.steer_bytes = 0
        self.follow_ups: deque[tuple[list[pb.Item], int]] = deque()
        self.follow_up_bytes = 0
        self.pause_reason: str | None = None
        self.paused = False
        # Calls waiting for a client's approval (by call_id) and the decisions that came for them.
        self.awaiting: dict[str, pb.ApprovalRequest] = {}
        self.decisions: dict[str, pb.ApprovalResponse] = {}
        self._bell: Channel | None = None
        # A control came while the run was not waiting: the next wait starts with it.
        self._rang = False

    # -- what any task may do ----------------------------------------------------------------------

    def send(self, control: pb.Control, response_id: str, ended: bool) -> None:
        """Record a control; RequestError (and no effect) when it does not fit the run's state."""
        which = control.WhichOneof("control")
        if ended or self.stop_reason:
            raise _precondition("response", f"response {response_id!r} is not in progress", "not_in_progress")
        if which == "cancel":
            self.stop("cancelled")
        elif which == "steer":
            self.steer_bytes += self._queue("steer", control.steer.items, control.steer.ByteSize())
            self.attention = True
        elif which == "follow_up":
            self.follow_up_bytes += self._queue("follow_up", control.follow_up.items, control.follow_up.ByteSize())
        elif which == "approval":
            self._decide(control.approval)
        elif which == "pause":
            self.pause_reason = control.pause.reason
        elif which == "resume":
            if not self.paused and self.pause_reason is None:
                raise _precondition("control.resume", "the response is not paused", "not_paused")
            self.pause_reason = None
        else:
            raise RequestError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "a control needs one of steer, follow_up, approval, pause, resume, cancel",
                [FieldViolation("control", "required")],
                "invalid_request",
            )
        self.ring()

    def stop(self, reason: str) -> None:
        if self.stop_reason:
            return
        self.stop_reason = reason
        self.attention = True
        self.ring()

    def detach(self) -> None:
        """The controlling client went away: nobody is left to decide approvals."""
        self.controller = False
        self.ring()

    def ring(self) -> None:
        if self._bell is not None:
            self._bell.ring()
        else:
            self._rang = True

    # -- what the run does -------------------------------------------------------------------------

    def listen(self, queue: Channel | None) -> None:
        """The queue the run reads now (None: it reads none and looks at the inbox when it can).
        A control that came since the last wait rings at once: the run may not have seen it."""
        self._bell = queue
        if queue is not None and self._rang:
            self._rang = False
            queue.ring()

    def take_steer(self) -> list[pb.Item]:
        items = [item for entry, _ in self.steers for item in entry]
        self.steers.clear()
        self.steer_bytes = 0
        self.attention = bool(self.stop_reason)
        return items

    def take_follow_up(self) -> list[pb.Item]:
        items, size = self.follow_ups.popleft()
        self.follow_up_bytes -= size
        return items

    def await_approvals(self, requests: Sequence[pb.ApprovalRequest]) -> None:
        self.awaiting = {r.call_id: r for r in requests}
        self.decisions = {}

    def take_decisions(self) -> Mapping[str, pb.ApprovalResponse]:
        decisions = self.decisions
        self.awaiting, self.decisions = {}, {}
        return decisions

    def clear(self) -> None:
        """The run ended: what is still queued is dropped (nothing will read it)."""
        self.steers.clear()
        self.follow_ups.clear()
        self.steer_bytes = self.follow_up_bytes = 0
        self.decisions, self.awaiting = {}, {}
        self._bell = None

    def _queue(self, kind: str, items: Sequence[pb.Item], size: int) -> int:
        """Queue the items a control adds, within the limits (checked before anything is copied);
        their bytes."""
        limits = self.limits
        if len(items) > limits.max_items:
            message = f"a {kind} may carry at most {limits.max_items} items, this one has {len(items)}"
            raise _exhausted(f"control.{kind}.items", message, "control_too_large")
        steer = kind == "steer"
        queue, queued = (self.steers, self.steer_bytes) if steer else (self.follow_ups, self.follow_up_bytes)
        max_count = limits.max_steers if steer else limits.max_follow_ups
        max_bytes = limits.max_steer_bytes if steer else limits.max_follow_up_bytes
        if size > max_bytes:
            message = f"a {kind} of {size} bytes is more than the {max_bytes} bytes one may hold"
            raise _exhausted(f"control.{kind}", message, "control_too_large")
        if len(queue) >= max_count or queued + size > max_bytes:
            message = (
                f"at most {max_count} {kind} controls of {max_bytes} bytes in all may wait for one response: "
                "send the next one after the ones queued are taken in"
            )
            raise _exhausted(f"control.{kind}", message, f"{kind}_queue_full")
        held = self.measure() + self.steer_bytes + self.follow_up_bytes
        if held + size > limits.max_response_bytes:
            message = (
                f"the response holds {held} bytes of input, output and queued controls; with this {kind} "
                f"({size} bytes) it would pass {limits.max_response_bytes} bytes, more than it could be read back "
                "or continued with: start a new response that continues this one"
            )
            raise _exhausted(f"control.{kind}", message, "response_too_large")
        queue.append(([_copy(i) for i in items], size))
        return size

    def _decide(self, approval: pb.ApprovalResponse) -> None:
        call_id = approval.call_id
        if call_id not in self.awaiting or call_id in self.decisions:
            raise _precondition(
                "control.approval.call_id", f"no call {call_id!r} is waiting for approval", "not_awaiting_approval"
            )
        decision = pb.ApprovalResponse()
        decision.CopyFrom(approval)
        self.decisions[call_id] = decision


def _copy(item: pb.Item) -> pb.Item:
    copy = pb.Item()
    copy.CopyFrom(item)
    return copy


def _precondition(field_name: str, message: str, reason: str) -> RequestError:
    return RequestError(grpc.StatusCode.FAILED_PRECONDITION, message, [FieldViolation(field_name, message)], reason)


def _exhausted(field_name: str, message: str, reason: str) -> RequestError:
    return RequestError(grpc.StatusCode.RESOURCE_EXHAUSTED, message, [FieldViolation(field_name, message)], reason)
