"""Calling the configured hooks at each point, in order, and applying what they answer.

The engine holds a `Dispatcher` only when hooks are configured (no hooks: nothing is built, nothing
is asked), and asks `wants(point)` before it builds a point's request.

Hooks are called one after another in the configured order; each sees what the ones before it
changed, and a decision that ends the point (reject, deny, an answer, a result, a pause) stops the
chain. A hook that raises, answers garbage or misses its timeout gets its failure policy:
  - fail-open: as if it had no objection; the failure is kept in `HookRun.failures` for the engine
    to emit as a `hook_failed` event;
  - fail-closed: at a tool point the call is denied (an is_error output says why); anywhere else
    `HookFailed` is raised and the response fails with code `hook_failed`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from google.protobuf.message import Message

from antwort_grpc import pb
from antwort_grpc.hooks.clients import HookClient
from antwort_grpc.hooks.service import Caller, Point, point_name

log = logging.getLogger(__name__)

P = Point
R = TypeVar("R", bound=Message)
Decision = pb.ApproveToolResponse.Decision


@dataclass(frozen=True, slots=True)
class HookFailure:
    hook: str
    point: int
    error: str
    call_id: str = ""

    def describe(self) -> str:
        return f"hook {self.hook} failed at {point_name(self.point)}: {self.error}"


class HookFailed(Exception):
    """A fail-closed hook failed where no tool call can absorb it: the response fails."""

    def __init__(self, failure: HookFailure) -> None:
        super().__init__(failure.describe())
        self.failure = failure


class HookRejected(Exception):
    """A before-response hook refused the request."""

    def __init__(self, hook: str, reason: str) -> None:
        super().__init__(f"rejected by hook {hook}: {reason}")
        self.hook = hook
        self.reason = reason


class _Garbage(ValueError):
    """A hook's answer that cannot be applied."""


@dataclass(slots=True)
class HookRun:
    """One response's side of the hooks: what every call carries, what the calls cost, and the
    fail-open failures the engine has not emitted yet."""

    caller: Caller
    context: pb.HookContext
    failures: list[HookFailure] = field(default_factory=list)
    calls: int = 0
    failed: int = 0
    seconds: float = 0.0

    def take_failures(self) -> list[HookFailure]:
        taken, self.failures = self.failures, []
        return taken


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


class Dispatcher:
    def __init__(self, hooks: Sequence[HookClient]) -> None:
        self.hooks = list(hooks)

    def wants(self, point: int) -> bool:
        return any(h.wants(point) for h in self.hooks)

    async def start(self) -> None:
        await asyncio.gather(*(h.start() for h in self.hooks))

    async def close(self) -> None:
        for hook in self.hooks:
            try:
                await hook.close()
            except Exception:
                log.exception("closing hook %s failed", hook.name)

    # -- the points -------------------------------------------------------------------------------

    async def before_response(
        self,
        run: HookRun,
        request: pb.CreateResponseRequest,
        problems: Callable[[pb.CreateResponseRequest], list[str]],
    ) -> pb.CreateResponseRequest:
        """The request to run (changed by hooks); HookRejected or HookFailed to refuse it.
        `problems` validates a replaced request: a hook's invalid request is its failure."""
        point = P.HOOK_POINT_BEFORE_RESPONSE
        for hook in self._hooks(point):

            def check(reply: pb.BeforeResponseResponse, current: pb.CreateResponseRequest = request) -> None:
                if reply.WhichOneof("decision") == "request":
                    replaced = pb.CreateResponseRequest()
                    replaced.CopyFrom(reply.request)
                    replaced.stream = current.stream
                    found = problems(replaced)
                    if found:
                        raise _Garbage(f"the request it returned is invalid: {'; '.join(found)}")

            ask = pb.BeforeResponseRequest(context=run.context, request=request)
            reply = await self._ask(run, hook, point, ask, pb.BeforeResponseResponse, check)
            if reply is None:
                continue
            which = reply.WhichOneof("decision")
            if which == "reject_reason":
                raise HookRejected(hook.name, reply.reject_reason)
            if which == "request":
                stream = request.stream
                request = pb.CreateResponseRequest()
                request.CopyFrom(reply.request)
                request.stream = stream
        return request

    async def after_response(self, run: HookRun, response: pb.Response) -> None:
        point = P.HOOK_POINT_AFTER_RESPONSE
        for hook in self._hooks(point):
            ask = pb.AfterResponseRequest(context=run.context, response=response)
            await self._ask(run, hook, point, ask, pb.AfterResponseResponse)

    async def before_model(self, run: HookRun, call: pb.ModelCall) -> ModelDecision:
        point = P.HOOK_POINT_BEFORE_MODEL
        for hook in self._hooks(point):
            ask = pb.BeforeModelRequest(context=run.context, call=call)
            reply = await self._ask(run, hook, point, ask, pb.BeforeModelResponse, partial(_check_model, call=call))
            if reply is None:
                continue
            which = reply.WhichOneof("decision")
            if which == "answer":
                return ModelDecision(call, [_answer_item(i) for i in reply.answer.output])
            if which == "change":
                call = _apply_change(call, reply.change)
        return ModelDecision(call)

    async def after_model(self, run: HookRun, output: Sequence[pb.Item], usage: pb.Usage | None) -> None:
        point = P.HOOK_POINT_AFTER_MODEL
        for hook in self._hooks(point):
            ask = pb.AfterModelRequest(context=run.context, output=output, usage=usage)
            await self._ask(run, hook, point, ask, pb.AfterModelResponse)

    async def before_tool(self, run: HookRun, call: pb.FunctionCall, tool: pb.Tool) -> ToolDecision:
        point = P.HOOK_POINT_BEFORE_TOOL
        for hook in self._hooks(point):
            ask = pb.BeforeToolRequest(context=run.context, call=call, tool=tool)
            try:
                reply = await self._ask(run, hook, point, ask, pb.BeforeToolResponse, _check_before_tool, call.call_id)
            except HookFailed as failed:
                return ToolDecision(call, _error(call, f"denied: {failed.failure.describe()}"))
            if reply is None:
                continue
            which = reply.WhichOneof("decision")
            if which == "deny_reason":
                return ToolDecision(call, _error(call, f"denied by hook {hook.name}: {reply.deny_reason}"))
            if which == "result":
                result = pb.FunctionCallOutput()
                result.CopyFrom(reply.result)
                result.call_id = call.call_id
                return ToolDecision(call, result)
            if which == "arguments":
                changed = pb.FunctionCall()
                changed.CopyFrom(call)
                changed.arguments = reply.arguments
                call = changed
        return ToolDecision(call)

    async def after_tool(
        self, run: HookRun, call: pb.FunctionCall, result: pb.FunctionCallOutput
    ) -> pb.FunctionCallOutput:
        point = P.HOOK_POINT_AFTER_TOOL
        for hook in self._hooks(point):
            ask = pb.AfterToolRequest(context=run.context, call=call, result=result)
            try:
                reply = await self._ask(run, hook, point, ask, pb.AfterToolResponse, None, call.call_id)
            except HookFailed as failed:
                # The result may hold what the hook was there to keep from the model.
                return _error(call, f"result withheld: {failed.failure.describe()}")
            if reply is not None and reply.HasField("result"):
                result = pb.FunctionCallOutput()
                result.CopyFrom(reply.result)
                result.call_id = call.call_id
        return result

    async def approve_tool(self, run: HookRun, call: pb.FunctionCall, tool: pb.Tool) -> Approval | None:
        """A deny from any hook wins; else an approval; None: no hook has an opinion."""
        point = P.HOOK_POINT_APPROVE_TOOL
        approval: Approval | None = None
        for hook in self._hooks(point):
            ask = pb.ApproveToolRequest(context=run.context, call=call, tool=tool)
            try:
                reply = await self._ask(run, hook, point, ask, pb.ApproveToolResponse, None, call.call_id)
            except HookFailed as failed:
                return Approval(False, failed.failure.describe(), hook.name)
            if reply is None:
                continue
            if reply.decision == Decision.DECISION_DENY:
                return Approval(False, reply.reason, hook.name)
            if reply.decision == Decision.DECISION_APPROVE and approval is None:
                approval = Approval(True, reply.reason, hook.name)
        return approval

    async def pause_check(self, run: HookRun, before_tools: bool = False) -> str | None:
        """The reason to pause, or None."""
        point = P.HOOK_POINT_PAUSE_CHECK
        at = (
            pb.PauseCheckRequest.CHECK_POINT_BEFORE_TOOLS
            if before_tools
            else pb.PauseCheckRequest.CHECK_POINT_TURN_BOUNDARY
        )
        for hook in self._hooks(point):
            ask = pb.PauseCheckRequest(context=run.context, check_point=at)
            reply = await self._ask(run, hook, point, ask, pb.PauseCheckResponse)
            if reply is not None and reply.pause:
                return reply.reason or f"paused by hook {hook.name}"
        return None

    # -- one call -----------------------------------------------------------------------------------

    def _hooks(self, point: int) -> list[HookClient]:
        return [h for h in self.hooks if h.wants(point)]

    async def _ask(
        self,
        run: HookRun,
        hook: HookClient,
        point: int,
        request: Message,
        reply_type: type[R],
        check: Callable[[R], None] | None = None,
        call_id: str = "",
    ) -> R | None:
        """The hook's answer, checked; None after a fail-open failure; HookFailed after a
        fail-closed one."""
        started = time.perf_counter()
        run.calls += 1
        try:
            async with asyncio.timeout(hook.timeout):
                reply = await hook.call(point, request, run.caller)
            if not isinstance(reply, reply_type):
                raise _Garbage(f"it answered a {type(reply).__name__}, not a {reply_type.__name__}")
            if check is not None:
                check(reply)
            return reply
        except TimeoutError:
            error = f"no answer within {hook.timeout:g}s"
        except Exception as err:
            error = str(err) if isinstance(err, _Garbage) else f"{type(err).__name__}: {err}"
        finally:
            run.seconds += time.perf_counter() - started
        run.failed += 1
        failure = HookFailure(hook.name, point, error, call_id)
        log.warning("%s (%s)", failure.describe(), "fail-open" if hook.fail_open else "fail-closed")
        if not hook.fail_open:
            raise HookFailed(failure)
        run.failures.append(failure)
        return None


def _error(call: pb.FunctionCall, message: str) -> pb.FunctionCallOutput:
    return pb.FunctionCallOutput(call_id=call.call_id, output=message, is_error=True)


def _check_before_tool(reply: pb.BeforeToolResponse) -> None:
    if reply.WhichOneof("decision") == "arguments":
        try:
            json.loads(reply.arguments)
        except ValueError:
            raise _Garbage("the arguments it returned are not JSON") from None


def _check_model(reply: pb.BeforeModelResponse, call: pb.ModelCall) -> None:
    which = reply.WhichOneof("decision")
    if which == "change" and reply.change.HasField("offered_tools"):
        known = {t.name for t in call.tools}
        unknown = [n for n in reply.change.offered_tools.names if n not in known]
        if unknown:
            raise _Garbage(f"it offered tools the request does not: {unknown}")
    elif which == "answer":
        if not reply.answer.output:
            raise _Garbage("its answer is empty")
        for item in reply.answer.output:
            kind = item.WhichOneof("kind")
            if kind == "message" and item.message.role in (pb.Role.ROLE_UNSPECIFIED, pb.Role.ROLE_ASSISTANT):
                continue
            if kind == "function_call" and item.function_call.call_id and item.function_call.name:
                continue
            raise _Garbage("an answer holds assistant messages and function calls (with call_id and name) only")


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
