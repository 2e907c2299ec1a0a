"""One response from start to end: its state, the emitter of its events, and the inbox of controls.

`Engine.start` builds a Run; `events()` drives it (the loop in loop.py) and `send(control)` acts on
it while it runs, from any task. Controls are checked against the run's state when they arrive
(a bad one raises RequestError and leaves the run as it was) and take effect where the loop looks:

- stop (cancel, deadline): at once. While the loop awaits the model, tools, approvals or a resume
  (`waiting`), the driving task is cancelled outright; otherwise a flag is seen at the next check.
- steer: at once while the model streams (the stream is cut); during tool calls and approvals
  when the round ends; otherwise at the next turn boundary.
- follow_up: when the model gives its final answer. pause: at the next check point.
- approval: wakes the wait for decisions.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc

from antwort_grpc import pb
from antwort_grpc.engine.emitter import ResponseEmitter
from antwort_grpc.engine.governor import Governor
from antwort_grpc.engine.outcomes import Completed, FinalOutcome
from antwort_grpc.engine.tools import ToolSet
from antwort_grpc.errors import FieldViolation, RequestError

if TYPE_CHECKING:
    from antwort_grpc.engine.model_call import ModelCall

# What the loop awaits when a control arrives (None: it is busy and will look at its next check).
MODEL = "model"
TOOLS = "tools"
APPROVAL = "approval"
PAUSE = "pause"


class Stopped(Exception):
    """A cancel or deadline noticed at a check point (not during an interruptible wait)."""


@dataclass(slots=True)
class Continuation:
    """What a continued response starts with, before its first model turn."""

    # Server-side calls an earlier response made that may run now (answered by nobody yet).
    calls: list[pb.FunctionCall] = field(default_factory=list)
    # Outputs to add first: denials decided in the request's approval_response items.
    outputs: list[pb.FunctionCallOutput] = field(default_factory=list)
    # Client-executed calls approved just now: handed to the client at once.
    handoff: list[pb.FunctionCall] = field(default_factory=list)


class Run:
    def __init__(
        self,
        request: pb.CreateResponseRequest,
        response: pb.Response,
        input_items: list[pb.Item],
        context: list[pb.Item],
        tools: ToolSet,
        owner: str,
        *,
        controller: bool = False,
        continuation: Continuation | None = None,
        governor: Governor | None = None,
    ) -> None:
        self.request = request
        self.response = response
        self.emitter = ResponseEmitter(response)
        self.input_items = input_items
        # Everything the model sees, in order: history, input, and what this response added.
        self.context = context
        self.tools = tools
        # Who started it: only they may read or control it.
        self.owner = owner
        # A client is attached that can decide approvals while the run waits (a Converse stream).
        self.controller = controller
        self.continuation = continuation or Continuation()
        # The policy over the run: hooks, limits, tool timeouts, the context window, metrics.
        self.governor = governor if governor is not None else Governor(request)
        self.governor.bind(response)
        self.outcome: FinalOutcome = Completed()
        # The first turn's model call, started before `created` is written.
        self.early: ModelCall | None = None
        self.task: asyncio.Task[object] | None = None
        self.done = asyncio.Event()
        # "cancelled" or "deadline" once a stop was asked for.
        self.reason = ""
        self.waiting: str | None = None
        # Something for the loop to look at on its next check (a stop or a steer): one flag, read
        # once per streamed delta.
        self.attention = False
        # The driving task was cancelled to cut a model call short for a steering message.
        self.interrupting = False
        self.turn = 0
        self.round = 0
        # Ids of output items made ahead (for the next model call's hooks asked ahead), by call id:
        # the items added then are the same items.
        self.output_ids: dict[str, str] = {}
        # The inbox.
        self.steer: list[pb.Item] = []
        self.follow_ups: list[list[pb.Item]] = []
        self.pause_reason: str | None = None
        self.paused = False
        # Calls waiting for approval (by call_id) and the decisions that came for them.
        self.awaiting: dict[str, pb.ApprovalRequest] = {}
        self.decisions: dict[str, pb.ApprovalResponse] = {}
        self._wake = asyncio.Event()
        # Calls superseded since the last injection (reported with it).
        self.superseded: list[str] = []
        # The request's deadline in loop time (remote executors pass what remains of it on).
        self.deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._events: Callable[[Run], AsyncGenerator[pb.StreamEvent, None]] | None = None

    @property
    def response_id(self) -> str:
        return self.response.id

    @property
    def stop_requested(self) -> bool:
        return bool(self.reason)

    def bind(self, driver: Callable[[Run], AsyncGenerator[pb.StreamEvent, None]]) -> None:
        self._events = driver

    def events(self) -> AsyncGenerator[pb.StreamEvent, None]:
        """Every event of the response; iterate it once. Failures after the first event end the
        stream in-band with a terminal event."""
        assert self._events is not None, "a Run is made by Engine.start"
        events, self._events = self._events, None
        return events(self)

    # -- controls --------------------------------------------------------------------------------

    def send(self, control: pb.Control) -> None:
        """Act on the run; RequestError (and no effect) when the control does not fit its state."""
        which = control.WhichOneof("control")
        if self.done.is_set() or self.reason:
            raise _precondition("response", f"response {self.response_id!r} is not in progress", "not_in_progress")
        if which == "cancel":
            self.stop("cancelled")
        elif which == "steer":
            self.steer += [_copy(i) for i in control.steer.items]
            self.attention = True
            if self.waiting == MODEL and self.task is not None and not self.interrupting:
                self.interrupting = True
                self.task.cancel()
            self._wake.set()
        elif which == "follow_up":
            self.follow_ups.append([_copy(i) for i in control.follow_up.items])
        elif which == "approval":
            call_id = control.approval.call_id
            if call_id not in self.awaiting or call_id in self.decisions:
                raise _precondition(
                    "control.approval.call_id", f"no call {call_id!r} is waiting for approval", "not_awaiting_approval"
                )
            decision = pb.ApprovalResponse()
            decision.CopyFrom(control.approval)
            self.decisions[call_id] = decision
            self._wake.set()
        elif which == "pause":
            self.pause_reason = control.pause.reason
        elif which == "resume":
            if not self.paused and self.pause_reason is None:
                raise _precondition("control.resume", "the response is not paused", "not_paused")
            self.pause_reason = None
            self._wake.set()
        else:
            raise RequestError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "a control needs one of steer, follow_up, approval, pause, resume, cancel",
                [FieldViolation("control", "required")],
                "invalid_request",
            )

    def detach(self) -> None:
        """The controlling client went away: nobody is left to decide approvals."""
        self.controller = False
        self._wake.set()

    def stop(self, reason: str = "cancelled") -> None:
        if self.reason:
            return
        self.reason = reason
        self.attention = True
        if self.waiting is not None and self.task is not None:
            self.task.cancel()

    def set_deadline(self, when: float) -> None:
        self._timer = asyncio.get_running_loop().call_at(when, self.stop, "deadline")

    def clear_deadline(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    # -- used by the loop ------------------------------------------------------------------------

    async def wake(self, timeout_at: float | None = None) -> bool:
        """Wait until a control arrives (False when `timeout_at`, in loop time, passes first)."""
        try:
            async with asyncio.timeout_at(timeout_at):
                await self._wake.wait()
        except TimeoutError:
            return False
        finally:
            self._wake.clear()
        return True

    def take_steer(self) -> list[pb.Item]:
        items, self.steer = self.steer, []
        self.attention = bool(self.reason)
        return items


def _copy(item: pb.Item) -> pb.Item:
    copy = pb.Item()
    copy.CopyFrom(item)
    return copy


def _precondition(field_name: str, message: str, reason: str) -> RequestError:
    return RequestError(grpc.StatusCode.FAILED_PRECONDITION, message, [FieldViolation(field_name, message)], reason)
