"""What each point asks a hook and how its answer is taken, one small class per point.

A step builds its request from what it holds now (`ask`), checks an answer before it is taken
(`check`: an answer that cannot be applied is the hook's failure), and takes it (`take`): it
keeps what the answer changed, and says whether the answer ends the whole plan (a pause, a
rejection, an answer in the model's place). A step that needs asking no more (its call was denied)
asks nothing. Fail-closed failures end the response (`HookFailed`), except at a tool call's steps,
where the call is denied instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message

from antwort_grpc import pb
from antwort_grpc.hooks.service import Point, point_name

P = Point
Decision = pb.ApproveToolResponse.Decision


# Where a hook runs, as gRPC's errors spell it: ipv4:10.0.0.3:50051, ipv6:[::1]:50051, or a bare
# address with its port.
_ADDRESSES = re.compile(r"(?:ipv[46]:)?(?:\[[0-9a-fA-F:.]*\]|\d{1,3}(?:\.\d{1,3}){3})(?::\d+)?")


def named(label: str) -> str:
    """A hook as the model and the client read of it: by its own name (the `hook` a step takes an
    answer from is that name, never the address the hook runs at)."""
    return f"hook {label}" if label else "a policy hook"


@dataclass(frozen=True, slots=True)
class HookFailure:
    hook: str
    point: int
    error: str
    call_id: str = ""
    # The hook's own name, and where it runs ("" in-process): a denial the model reads names the
    # one, never the other.
    label: str = ""
    target: str = ""

    def describe(self) -> str:
        return f"hook {self.hook} failed at {point_name(self.point)}: {self.error}"

    def shown(self) -> str:
        """The failure as the model may read it: the network address of the hook, and any
        address in its error, left out."""
        error = self.error.replace(self.target, "…") if self.target else self.error
        error = _ADDRESSES.sub("…", error)
        return f"{named(self.label)} failed at {point_name(self.point)}: {error}"


class HookFailed(Exception):
    """A fail-closed hook failed where no tool call can absorb it: the response fails."""

    def __init__(self, failure: HookFailure) -> None:
        super().__init__(failure.describe())
        self.failure = failure


class HookRejected(Exception):
    """A before-response hook refused the request."""

    def __init__(self, hook: str, reason: str) -> None:
        super().__init__(f"rejected by {named(hook)}: {reason}")
        self.hook = hook
        self.reason = reason


class Garbage(ValueError):
    """A hook's answer that cannot be applied."""


@dataclass(frozen=True, slots=True)
class ModelDecision:
    # The call to make (changed by hooks), or, when `answer` is set, the call not made.
    call: pb.ModelCall
    answer: list[pb.Item] | None = None


@dataclass(frozen=True, slots=True)
class ToolDecision:
    call: pb.FunctionCall
    # Set: do not run the call, this is its output (a hook's result, a denial, a failure).
    result: pb.FunctionCallOutput | None = None


@dataclass(frozen=True, slots=True)
class Approval:
    approved: bool
    reason: str
    hook: str


# The answer a step takes: its point's answer type (the dispatcher refuses any other answer before
# a step sees it).
A = TypeVar("A", bound=Message)


class Step(Generic[A]):
    point: int
    call_id: str = ""
    # The answer changed what the steps asked ahead of it were built from.
    changed: bool = False

    def ask(self, context: pb.HookContext) -> Message | None:
        raise NotImplementedError

    def check(self, reply: A) -> None:
        """Raise Garbage for an answer that cannot be applied."""

    def take(self, hook: str, reply: A | None) -> bool:
        """Take an answer (None: the hook failed open, as if it had no objection); True ends the plan."""
        return False

    def fail_closed(self, failure: HookFailure) -> bool:
        raise HookFailed(failure)


# What is wrong with a request, as the responses layer validates one: the request a
# before-response hook returns is checked with it, and is that hook's failure when it has problems.
Problems = Callable[[pb.CreateResponseRequest], list[str]]


class BeforeResponse(Step[pb.BeforeResponseResponse]):
    point = P.HOOK_POINT_BEFORE_RESPONSE

    def __init__(self, request: pb.CreateResponseRequest, problems: Problems) -> None:
        self.request = request
        self.problems = problems

    def ask(self, context: pb.HookContext) -> Message:
        return pb.BeforeResponseRequest(context=context, request=self.request)

    def check(self, reply: pb.BeforeResponseResponse) -> None:
        if reply.WhichOneof("decision") == "request":
            found = self.problems(self._replaced(reply))
            if found:
                raise Garbage(f"the request it returned is invalid: {'; '.join(found)}")

    def take(self, hook: str, reply: pb.BeforeResponseResponse | None) -> bool:
        which = reply.WhichOneof("decision") if reply is not None else None
        if reply is not None and which == "reject_reason":
            raise HookRejected(hook, reply.reject_reason)
        if reply is not None and which == "request":
            self.request = self._replaced(reply)
            self.changed = True
        return False

    def _replaced(self, reply: pb.BeforeResponseResponse) -> pb.CreateResponseRequest:
        """The hook's request, with the transport's stream flag."""
        replaced = pb.CreateResponseRequest()
        replaced.CopyFrom(reply.request)
        replaced.stream = self.request.stream
        return replaced


class Observe(Step[Message]):
    """An observing point (after model, after response): nothing to take from the answer."""

    def __init__(self, point: int, request: Message) -> None:
        self.point = point
        self.request = request

    def ask(self, context: pb.HookContext) -> Message:
        return self.request


class TurnStep(Step[A]):
    """A step of a turn (pause check, before model), possibly asked ahead of another step: once that
    step's answer changed what this one was built from, this one asks nothing (it is asked again,
    rebuilt, when the changed step comes)."""

    def __init__(self, turn: int | None, ahead_of: Step[Any] | None) -> None:
        self.turn = turn
        self.ahead_of = ahead_of

    def _still_asked(self, context: pb.HookContext) -> bool:
        """False when the step ahead changed; else True, with the turn put on `context`."""
        if self.ahead_of is not None and self.ahead_of.changed:
            return False
        if self.turn is not None:
            context.turn = self.turn
        return True


class PauseCheck(TurnStep[pb.PauseCheckResponse]):
    point = P.HOOK_POINT_PAUSE_CHECK

    def __init__(self, before_tools: bool, turn: int | None = None, ahead_of: Step[Any] | None = None) -> None:
        super().__init__(turn, ahead_of)
        self.at = (
            pb.PauseCheckRequest.CHECK_POINT_BEFORE_TOOLS
            if before_tools
            else pb.PauseCheckRequest.CHECK_POINT_TURN_BOUNDARY
        )
        self.reason: str | None = None

    def ask(self, context: pb.HookContext) -> Message | None:
        if not self._still_asked(context):
            return None
        return pb.PauseCheckRequest(context=context, check_point=self.at)

    def take(self, hook: str, reply: pb.PauseCheckResponse | None) -> bool:
        if reply is not None and reply.pause:
            self.reason = reply.reason or f"paused by {named(hook)}"
            return True
        return False


class BeforeModel(TurnStep[pb.BeforeModelResponse]):
    point = P.HOOK_POINT_BEFORE_MODEL

    def __init__(self, call: pb.ModelCall, turn: int | None = None, ahead_of: Step[Any] | None = None) -> None:
        super().__init__(turn, ahead_of)
        self.call = call
        self.answer: list[pb.Item] | None = None

    def ask(self, context: pb.HookContext) -> Message | None:
        if not self._still_asked(context):
            return None
        return pb.BeforeModelRequest(context=context, call=self.call)

    def check(self, reply: pb.BeforeModelResponse) -> None:
        which = reply.WhichOneof("decision")
        if which == "change" and reply.change.HasField("offered_tools"):
            known = {t.name for t in self.call.tools}
            unknown = [n for n in reply.change.offered_tools.names if n not in known]
            if unknown:
                raise Garbage(f"it offered tools the request does not: {unknown}")
        elif which == "answer":
            if not reply.answer.output:
                raise Garbage("its answer is empty")
            for item in reply.answer.output:
                kind = item.WhichOneof("kind")
                if kind == "message" and item.message.role in (pb.Role.ROLE_UNSPECIFIED, pb.Role.ROLE_ASSISTANT):
                    continue
                if kind == "function_call" and item.function_call.call_id and item.function_call.name:
                    continue
                raise Garbage("an answer holds assistant messages and function calls (with call_id and name) only")

    def take(self, hook: str, reply: pb.BeforeModelResponse | None) -> bool:
        which = reply.WhichOneof("decision") if reply is not None else None
        if reply is not None and which == "answer":
            self.answer = [_answer_item(i) for i in reply.answer.output]
            return True
        if reply is not None and which == "change":
            self.call = _apply_change(self.call, reply.change)
        return False

    @property
    def decision(self) -> ModelDecision:
        return ModelDecision(self.call, self.answer)


class ToolStep(Step[A]):
    """A step about one tool call, known by its call_id (which a hook's change of the call keeps)."""

    def __init__(self, call: pb.FunctionCall) -> None:
        self.call = call
        self.call_id = call.call_id

    def _hook_result(self, result: pb.FunctionCallOutput) -> pb.FunctionCallOutput:
        """A hook's result as this call's output: under the call's own id, whatever it says."""
        output = pb.FunctionCallOutput()
        output.CopyFrom(result)
        output.call_id = self.call_id
        return output


class ApproveTool(ToolStep[pb.ApproveToolResponse]):
    """A deny from any hook wins (the hooks after it are not asked); else the first approval."""

    point = P.HOOK_POINT_APPROVE_TOOL

    def __init__(self, call: pb.FunctionCall, tool: pb.Tool) -> None:
        super().__init__(call)
        self.tool = tool
        self.approval: Approval | None = None

    @property
    def denied(self) -> bool:
        return self.approval is not None and not self.approval.approved

    def ask(self, context: pb.HookContext) -> Message | None:
        if self.denied:
            return None
        return pb.ApproveToolRequest(context=context, call=self.call, tool=self.tool)

    def take(self, hook: str, reply: pb.ApproveToolResponse | None) -> bool:
        if reply is not None and reply.decision == Decision.DECISION_DENY:
            self.approval = Approval(False, reply.reason, hook)
        elif reply is not None and reply.decision == Decision.DECISION_APPROVE and self.approval is None:
            self.approval = Approval(True, reply.reason, hook)
        return False

    def fail_closed(self, failure: HookFailure) -> bool:
        self.approval = Approval(False, failure.shown(), failure.hook)
        return False


class BeforeTool(ToolStep[pb.BeforeToolResponse]):
    """Asked only while the call is still going to run: not after a hook denied or answered it,
    nor after its approval was denied (`gate`)."""

    point = P.HOOK_POINT_BEFORE_TOOL

    def __init__(self, call: pb.FunctionCall, tool: pb.Tool, gate: ApproveTool | None = None) -> None:
        super().__init__(call)
        self.tool = tool
        self.gate = gate
        self.result: pb.FunctionCallOutput | None = None

    def ask(self, context: pb.HookContext) -> Message | None:
        if self.result is not None or (self.gate is not None and self.gate.denied):
            return None
        return pb.BeforeToolRequest(context=context, call=self.call, tool=self.tool)

    def check(self, reply: pb.BeforeToolResponse) -> None:
        if reply.WhichOneof("decision") == "arguments":
            try:
                json.loads(reply.arguments)
            except ValueError:
                raise Garbage("the arguments it returned are not JSON") from None

    def take(self, hook: str, reply: pb.BeforeToolResponse | None) -> bool:
        which = reply.WhichOneof("decision") if reply is not None else None
        if reply is not None and which == "deny_reason":
            self.result = error_output(self.call, f"denied by {named(hook)}: {reply.deny_reason}")
        elif reply is not None and which == "result":
            self.result = self._hook_result(reply.result)
        elif reply is not None and which == "arguments":
            changed = pb.FunctionCall()
            changed.CopyFrom(self.call)
            changed.arguments = reply.arguments
            self.call = changed
        return False

    def fail_closed(self, failure: HookFailure) -> bool:
        self.result = error_output(self.call, f"denied: {failure.shown()}")
        return False

    @property
    def decision(self) -> ToolDecision:
        return ToolDecision(self.call, self.result)


class AfterTool(ToolStep[pb.AfterToolResponse]):
    point = P.HOOK_POINT_AFTER_TOOL

    def __init__(self, call: pb.FunctionCall, result: pb.FunctionCallOutput) -> None:
        super().__init__(call)
        self.result = result
        self.withheld = False

    def ask(self, context: pb.HookContext) -> Message | None:
        if self.withheld:
            return None
        return pb.AfterToolRequest(context=context, call=self.call, result=self.result)

    def take(self, hook: str, reply: pb.AfterToolResponse | None) -> bool:
        if reply is not None and reply.HasField("result"):
            self.result = self._hook_result(reply.result)
            self.changed = True
        return False

    def fail_closed(self, failure: HookFailure) -> bool:
        # The result may hold what the hook was there to keep from the model.
        self.result = error_output(self.call, f"result withheld: {failure.describe()}")
        self.withheld = self.changed = True
        return False


def error_output(call: pb.FunctionCall, message: str) -> pb.FunctionCallOutput:
    return pb.FunctionCallOutput(call_id=call.call_id, output=message, is_error=True)


def _apply_change(call: pb.ModelCall, change: pb.ModelCallChange) -> pb.ModelCall:
    changed = pb.ModelCall()
    changed.CopyFrom(call)
    if change.HasField("instructions"):
        changed.instructions = change.instructions
    if change.HasField("temperature"):
        changed.temperature = change.temperature
    if change.HasField("offered_tools"):
        offered = set(change.offered_tools.names)
        kept = [t for t in call.tools if t.name in offered]
        del changed.tools[:]
        changed.tools.extend(kept)
    changed.items.extend(change.append_items)
    return changed


def _answer_item(item: pb.Item) -> pb.Item:
    answer = pb.Item()
    answer.CopyFrom(item)
    if answer.WhichOneof("kind") == "message":
        answer.message.role = pb.Role.ROLE_ASSISTANT
    return answer
