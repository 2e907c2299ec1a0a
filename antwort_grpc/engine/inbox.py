"""A run's inbox: the controls that came for it and not yet acted on, and the bell that tells a
waiting run that one came.

Controls never interrupt a task: `send` records what came and rings the bell of the wait the run
is in (if any). Every wait of a run reads one queue — a model call's deltas, tool results and
progress, or a queue of its own — and the bell is one more message on that channel, so a wait ends
the moment a control arrives and the run decides what it means where it is. Cancellation stays
what it means in asyncio: the client went away, or the server is shutting down.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import grpc

from antwort_grpc import pb
from antwort_grpc.engine.channel import Channel
from antwort_grpc.errors import FieldViolation, RequestError

# Follow-ups queued on one run: at most this many, holding at most this many bytes.
MAX_FOLLOW_UPS = 16
MAX_FOLLOW_UP_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class InboxLimits:
    max_follow_ups: int = MAX_FOLLOW_UPS
    max_follow_up_bytes: int = MAX_FOLLOW_UP_BYTES


class Inbox:
    """What came for a run. The run reads and takes; `send` (any task) only records and rings."""

    __slots__ = (
        "_bell",
        "_follow_up_bytes",
        "_rang",
        "attention",
        "awaiting",
        "controller",
        "decisions",
        "follow_ups",
        "limits",
        "pause_reason",
        "paused",
        "steer",
        "stop_reason",
    )

    def __init__(self, controller: bool = False, limits: InboxLimits = InboxLimits()) -> None:
        # A client is attached that can decide approvals while the run waits (a Converse stream).
        self.controller = controller
        self.limits = limits
        # "cancelled", "deadline" or "max_duration" once a stop was asked for.
        self.stop_reason = ""
        # Something for the run to look at on its next check (a stop or a steer): one flag, read
        # once per streamed delta.
        self.attention = False
        self.steer: list[pb.Item] = []
        self.follow_ups: deque[list[pb.Item]] = deque()
        self._follow_up_bytes = 0
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
            self.steer += [_copy(i) for i in control.steer.items]
            self.attention = True
        elif which == "follow_up":
            self._queue_follow_up(control.follow_up.items)
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

    def pause(self, reason: str) -> None:
        """A pause asked for by a hook (a client's comes with `send`)."""
        self.pause_reason = reason

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
        items, self.steer = self.steer, []
        self.attention = bool(self.stop_reason)
        return items

    def take_follow_up(self) -> list[pb.Item]:
        items = self.follow_ups.popleft()
        self._follow_up_bytes -= sum(i.ByteSize() for i in items)
        return items

    def clear(self) -> None:
        """The run ended: what is still queued is dropped (nothing will read it)."""
        self.steer, self.decisions, self.awaiting = [], {}, {}
        self.follow_ups.clear()
        self._follow_up_bytes = 0
        self._bell = None

    def _queue_follow_up(self, items: object) -> None:
        copied = [_copy(i) for i in items]  # type: ignore[attr-defined]
        size = sum(i.ByteSize() for i in copied)
        limits = self.limits
        if len(self.follow_ups) >= limits.max_follow_ups or self._follow_up_bytes + size > limits.max_follow_up_bytes:
            message = (
                f"at most {limits.max_follow_ups} follow-ups of {limits.max_follow_up_bytes} bytes in all may wait "
                "for one response: send the next one after the ones queued are answered"
            )
            raise RequestError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                message,
                [FieldViolation("control.follow_up", message)],
                "follow_up_queue_full",
            )
        self.follow_ups.append(copied)
        self._follow_up_bytes += size

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
