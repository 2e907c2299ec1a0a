"""Calling the configured hooks at each point, in order, and applying what they answer.

The engine holds a `Dispatcher` only when hooks are configured (no hooks: nothing is built, nothing
is asked), and asks `wants(point)` before it builds a point's request.

Hooks are called one after another in the configured order; each sees what the ones before it
changed, and a decision that ends the point (reject, deny, an answer, a result, a pause) stops the
chain. Points that follow each other with nothing in between — the pause check and the model call
at a turn boundary; the pause check, approvals and before-tool calls before tools start — are a
plan: when one hook is at all of its points, it gets them in one exchange (it evaluates them in
order and stops at the first answer that is not empty; the rest is asked again, rebuilt with what
that answer changed); with several hooks, each point is asked of each hook in turn. Observing
points (after model) are held and go with the hook's next exchange, or on their own when the run
is about to wait (`flush`).

A hook that raises, answers garbage or misses its timeout gets its failure policy:
  - fail-open: as if it had no objection; the failure is kept in `HookRun.failures` for the engine
    to emit as a `hook_failed` event;
  - fail-closed: at a tool point the call is denied (an is_error output says why); anywhere else
    `HookFailed` is raised and the response fails with code `hook_failed` (for a held observation:
    at the run's next point, or as it ends).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import Message

from antwort_grpc import pb
from antwort_grpc.hooks import steps
from antwort_grpc.hooks.clients import HookClient
from antwort_grpc.hooks.service import POINTS, Caller, Exchange, Point
from antwort_grpc.hooks.steps import (
    Approval,
    Garbage,
    HookFailed,
    HookFailure,
    HookRejected,
    ModelDecision,
    Problems,
    Step,
    ToolDecision,
)

log = logging.getLogger(__name__)

P = Point
__all__ = [
    "Approval",
    "Dispatcher",
    "HookFailed",
    "HookFailure",
    "HookRejected",
    "HookRun",
    "ModelDecision",
    "Paused",
    "Problems",
    "ToolDecision",
    "ToolsDecision",
]


@dataclass(slots=True)
class HookRun:
    """One response's side of the hooks: what every call carries, what the calls cost, the
    fail-open failures the engine has not emitted yet, and the observations not sent yet."""

    caller: Caller
    context: pb.HookContext
    failures: list[HookFailure] = field(default_factory=list)
    calls: int = 0
    failed: int = 0
    seconds: float = 0.0
    held: dict[int, list[Step[Any]]] = field(default_factory=dict)
    sending: set[asyncio.Task[None]] = field(default_factory=set)
    # A fail-closed failure of an observation sent on its own: the response fails at its next point.
    closed: HookFailure | None = None

    def take_failures(self) -> list[HookFailure]:
        taken, self.failures = self.failures, []
        return taken

    def raise_closed(self) -> None:
        """Raise that failure, once."""
        failure, self.closed = self.closed, None
        if failure is not None:
            raise HookFailed(failure)


@dataclass(frozen=True, slots=True)
class Paused:
    reason: str


@dataclass(frozen=True, slots=True)
class ToolsDecision:
    """Before tools start: each call's approval by the hooks (absent: no opinion), and the
    before-tool decisions already taken for calls that run without a client's decision."""

    approvals: dict[str, Approval]
    decided: dict[str, ToolDecision]


@dataclass(frozen=True, slots=True)
class _Ask:
    step: Step[Any]
    request: Message


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
        self, run: HookRun, request: pb.CreateResponseRequest, problems: Problems
    ) -> pb.CreateResponseRequest:
        """The request to run (changed by hooks); HookRejected or HookFailed to refuse it.
        `problems` validates a replaced request: a hook's invalid request is its failure."""
        step = steps.BeforeResponse(request, problems)
        await self._plan(run, [step])
        return step.request

    async def admit(
        self,
        run: HookRun,
        request: pb.CreateResponseRequest,
        problems: Problems,
        first: pb.ModelCall,
        pause: bool,
    ) -> tuple[pb.CreateResponseRequest, Paused | ModelDecision | None]:
        """`before_response`, with the first model call's hooks asked ahead (see `_ahead`)."""
        step = steps.BeforeResponse(request, problems)
        if not self._one_at(step.point):
            await self._plan(run, [step])
            return step.request, None
        ahead = await self._ahead(run, step, first, 0, pause)
        return step.request, ahead

    async def after_tool_ahead(
        self,
        run: HookRun,
        call: pb.FunctionCall,
        result: pb.FunctionCallOutput,
        following: pb.ModelCall,
        turn: int,
        pause: bool,
    ) -> tuple[pb.FunctionCallOutput, Paused | ModelDecision | None]:
        """`after_tool`, with the next model call's hooks asked ahead (see `_ahead`): `following`
        is that call as it will be if the result stays as it is; `turn` the turn that ends."""
        step = steps.AfterTool(call, result)
        if not self._one_at(step.point):
            await self._plan(run, [step], tool_point=True)
            return step.result, None
        ahead = await self._ahead(run, step, following, turn, pause, tool_point=True)
        return step.result, ahead

    def _one_at(self, point: int) -> bool:
        """Whether one hook is at `point` and every point up to the model call after it."""
        points = (point, P.HOOK_POINT_PAUSE_CHECK, P.HOOK_POINT_BEFORE_MODEL)
        return sum(1 for h in self.hooks if any(h.wants(p) for p in points)) == 1

    async def _ahead(
        self, run: HookRun, step: Step[Any], call: pb.ModelCall, turn: int, pause: bool, tool_point: bool = False
    ) -> Paused | ModelDecision | None:
        """`step`, then the pause check at the boundary after `turn` (when `pause`) and the next
        model call's hooks in the same exchange, unless the step's answer changed what that call
        was built from. Their outcome; None when they were not asked."""
        check = steps.PauseCheck(before_tools=False, turn=turn, ahead_of=step) if pause else None
        model = steps.BeforeModel(call, turn=turn + 1, ahead_of=step)
        await self._plan(run, [step, check, model] if check else [step, model], tool_point)
        if step.changed:
            return None
        if check is not None and check.reason is not None:
            return Paused(check.reason)
        return model.decision

    async def after_response(self, run: HookRun, response: pb.Response) -> None:
        """The audit point, then every held observation delivered: HookFailed when a fail-closed
        hook could not see them."""
        point = P.HOOK_POINT_AFTER_RESPONSE
        if self.wants(point):
            request = pb.AfterResponseRequest(context=run.context, response=response)
            await self._plan(run, [steps.Observe(point, request)])
        await self.settle(run)

    async def before_model(self, run: HookRun, call: pb.ModelCall) -> ModelDecision:
        step = steps.BeforeModel(call)
        await self._plan(run, [step])
        return step.decision

    async def model_turn(self, run: HookRun, call: pb.ModelCall, turn: int, pause: bool) -> Paused | ModelDecision:
        """At a turn boundary: the pause check (when `pause`), then the model call's hooks."""
        check = steps.PauseCheck(before_tools=False, turn=turn - 1) if pause else None
        model = steps.BeforeModel(call, turn)
        await self._plan(run, [check, model] if check else [model])
        if check is not None and check.reason is not None:
            return Paused(check.reason)
        return model.decision

    def after_model(self, run: HookRun, output: Sequence[pb.Item], usage: pb.Usage | None) -> None:
        """Held: it goes with the hook's next exchange (or `flush`)."""
        point = P.HOOK_POINT_AFTER_MODEL
        request = pb.AfterModelRequest(context=run.context, output=output, usage=usage)
        for index, hook in enumerate(self.hooks):
            if hook.wants(point):
                run.held.setdefault(index, []).append(steps.Observe(point, request))

    async def before_tools(
        self,
        run: HookRun,
        calls: Sequence[tuple[pb.FunctionCall, pb.Tool]],
        pause: bool,
        ahead: Callable[[pb.FunctionCall], bool],
    ) -> Paused | ToolsDecision:
        """Before a turn's calls start: the pause check (when `pause`), the approvals, and the
        before-tool hooks of the calls `ahead` says will run with no client's decision."""
        check = steps.PauseCheck(before_tools=True) if pause else None
        gates = [steps.ApproveTool(call, tool) for call, tool in calls] if self.wants(P.HOOK_POINT_APPROVE_TOOL) else []
        gate_of = {g.call_id: g for g in gates}
        tools = [steps.BeforeTool(call, tool, gate_of.get(call.call_id)) for call, tool in calls if ahead(call)]
        plan: list[Step[Any]] = [check] if check else []
        plan += gates
        plan += tools
        await self._plan(run, plan)
        if check is not None and check.reason is not None:
            return Paused(check.reason)
        return ToolsDecision(
            {g.call_id: g.approval for g in gates if g.approval is not None},
            {t.call_id: t.decision for t in tools if not (t.gate and t.gate.denied)},
        )

    async def before_tool(self, run: HookRun, call: pb.FunctionCall, tool: pb.Tool) -> ToolDecision:
        step = steps.BeforeTool(call, tool)
        await self._plan(run, [step], tool_point=True)
        return step.decision

    async def after_tool(
        self, run: HookRun, call: pb.FunctionCall, result: pb.FunctionCallOutput
    ) -> pb.FunctionCallOutput:
        step = steps.AfterTool(call, result)
        await self._plan(run, [step], tool_point=True)
        return step.result

    async def approve_tool(self, run: HookRun, call: pb.FunctionCall, tool: pb.Tool) -> Approval | None:
        """A deny from any hook wins; else an approval; None: no hook has an opinion."""
        step = steps.ApproveTool(call, tool)
        await self._plan(run, [step], tool_point=True)
        return step.approval

    async def pause_check(self, run: HookRun, before_tools: bool = False) -> str | None:
        """The reason to pause, or None."""
        step = steps.PauseCheck(before_tools)
        await self._plan(run, [step])
        return step.reason

    # -- observations held --------------------------------------------------------------------------

    def flush(self, run: HookRun) -> None:
        """Send the held observations now, without waiting for their answers (the run is about
        to wait on something else)."""
        for index in list(run.held):
            task = asyncio.create_task(self._send_held(run, index))
            run.sending.add(task)
            task.add_done_callback(run.sending.discard)

    async def settle(self, run: HookRun) -> None:
        """Every observation delivered and answered; HookFailed if a fail-closed hook failed."""
        self.flush(run)
        if run.sending:
            await asyncio.gather(*run.sending)
        run.raise_closed()

    async def _send_held(self, run: HookRun, index: int) -> None:
        try:
            await self._exchange(run, index, [])
        except HookFailed as failed:
            run.closed = run.closed or failed.failure

    # -- plans and exchanges ------------------------------------------------------------------------

    async def _plan(self, run: HookRun, plan: Sequence[Step[Any]], tool_point: bool = False) -> None:
        """Ask the hooks the plan's steps: in one exchange when one hook is at all of them, else
        step by step and hook by hook. Returns early when a step's answer ends the plan."""
        if not tool_point:
            run.raise_closed()
        at = [i for i, h in enumerate(self.hooks) if any(h.wants(s.point) for s in plan)]
        if len(at) == 1:
            hook = self.hooks[at[0]]
            await self._chain(run, at[0], [s for s in plan if hook.wants(s.point)])
        else:
            await self._in_turn(run, at, plan)
        if not tool_point:
            # A held observation that went with this exchange and failed closed.
            run.raise_closed()

    async def _in_turn(self, run: HookRun, at: list[int], plan: Sequence[Step[Any]]) -> None:
        for step in plan:
            for index in at:
                if self.hooks[index].wants(step.point) and await self._chain(run, index, [step]):
                    return

    async def _chain(self, run: HookRun, index: int, plan: list[Step[Any]]) -> bool:
        """One hook's steps, in as few exchanges as its answers allow; True when one ended the plan."""
        hook = self.hooks[index]
        while plan:
            asks = [_Ask(s, r) for s in plan if (r := s.ask(run.context)) is not None]
            if not asks:
                return False
            outcomes = await self._exchange(run, index, asks)
            for ask, outcome in zip(asks, outcomes, strict=False):
                if isinstance(outcome, HookFailure):
                    if hook.fail_open:
                        run.failures.append(outcome)
                        ended = ask.step.take(hook.label, None)
                    else:
                        ended = ask.step.fail_closed(outcome)
                else:
                    ended = ask.step.take(hook.label, outcome)
                if ended:
                    return True
            plan = [a.step for a in asks[len(outcomes) :]]
        return False

    async def _exchange(self, run: HookRun, index: int, asks: list[_Ask]) -> list[Message | HookFailure]:
        """The held observations first, then `asks`: the outcome of each of `asks` evaluated."""
        held = run.held.pop(index, None)
        hook = self.hooks[index]
        while held:
            observed = [_Ask(s, s.ask(run.context)) for s in held]  # type: ignore[arg-type]
            outcomes = await self._send(run, hook, observed + asks)
            for outcome in outcomes[: len(held)]:
                if isinstance(outcome, HookFailure) and hook.fail_open:
                    run.failures.append(outcome)
                elif isinstance(outcome, HookFailure):
                    run.closed = run.closed or outcome
            if len(outcomes) >= len(held):
                return outcomes[len(held) :]
            held = held[len(outcomes) :]
        return await self._send(run, hook, asks) if asks else []

    async def _send(self, run: HookRun, hook: HookClient, asks: list[_Ask]) -> list[Message | HookFailure]:
        """One exchange: an outcome per call evaluated, in order (a checked answer or a failure)."""
        started = time.perf_counter()
        run.calls += len(asks)
        timeout = hook.timeout * len(asks)
        try:
            async with asyncio.timeout(timeout):
                exchange = await hook.exchange([a.request for a in asks], run.caller)
            outcomes = _outcomes(hook, asks, exchange)
        except TimeoutError:
            outcomes = [_failure(hook, a, f"no answer within {timeout:g}s") for a in asks]
        except Exception as err:
            outcomes = [_failure(hook, a, f"{type(err).__name__}: {err}") for a in asks]
        finally:
            run.seconds += time.perf_counter() - started
        for outcome in outcomes:
            if isinstance(outcome, HookFailure):
                run.failed += 1
                log.warning("%s (%s)", outcome.describe(), "fail-open" if hook.fail_open else "fail-closed")
        return outcomes


def _outcomes(hook: HookClient, asks: list[_Ask], exchange: Exchange) -> list[Message | HookFailure]:
    """The answers checked, up to and including the first that is not empty; then the failure of
    the call after them, if the hook stopped early without an answer that explains it."""
    outcomes: list[Message | HookFailure] = []
    for ask, answer in zip(asks, exchange.answers, strict=False):
        expected = POINTS[ask.step.point].reply
        try:
            if not isinstance(answer, expected):
                raise Garbage(f"it answered a {type(answer).__name__}, not a {expected.__name__}")
            ask.step.check(answer)
        except Garbage as garbage:
            outcomes.append(_failure(hook, ask, str(garbage)))
            return outcomes
        outcomes.append(answer)
        if answer.ByteSize():
            return outcomes
    if len(outcomes) < len(asks):
        error = exchange.error or f"it answered {len(outcomes)} of {len(asks)} calls"
        outcomes.append(_failure(hook, asks[len(outcomes)], error))
    return outcomes


def _failure(hook: HookClient, ask: _Ask, error: str) -> HookFailure:
    return HookFailure(hook.name, ask.step.point, error, ask.step.call_id, hook.label, hook.target)
