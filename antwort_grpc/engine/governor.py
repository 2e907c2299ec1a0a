"""The policy over one run, in one place the loop asks at its check points: hooks, execution
limits, tool timeouts, the tool failure mode, the context window, and the run's metrics.

The loop stays the loop: it calls a Governor method where a policy applies and acts on the
answer. Everything here is cheap when nothing is configured: no hooks means no hook request is
ever built (`wants` is one attribute test), truncation DISABLED means the model sees the context
as it is, and metrics are a few additions per turn.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from antwort_grpc import pb
from antwort_grpc.engine import window as windows
from antwort_grpc.engine.budget import (
    RunLimits,
    ServerLimits,
    ToolTimeouts,
    output_budget,
    output_tokens_spent,
    run_limits,
)
from antwort_grpc.engine.run_metrics import RunRecorder
from antwort_grpc.engine.outcomes import Failed
from antwort_grpc.engine.turn_rules import needs_approval
from antwort_grpc.executors.base import ProgressSink, ToolTimeoutSource
from antwort_grpc.hooks.dispatch import (
    Dispatcher,
    HookFailed,
    HookFailure,
    HookRun,
    ModelDecision,
    Paused,
    ToolDecision,
)
from antwort_grpc.hooks.service import Caller, Point
from antwort_grpc.providers.base import Completion, Provider, ProviderError, ProviderEvent, TurnRequest

if TYPE_CHECKING:
    from antwort_grpc.engine.emitter import ResponseEmitter
    from antwort_grpc.engine.tools import Route

P = Point
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
# The next model call (its turn and request) as it will be with a given tool result, or None
# when it is not certain there will be one.
Following = Callable[[pb.FunctionCallOutput], "tuple[int, TurnRequest] | None"]
# Plain ints: a protobuf enum attribute lookup is a Python-level call, and these are read per run.
FAIL: int = pb.ToolFailureMode.TOOL_FAILURE_MODE_FAIL
AUTO: int = pb.Truncation.TRUNCATION_AUTO


class Governor:
    def __init__(
        self,
        request: pb.CreateResponseRequest,
        server: ServerLimits | None = None,
        hooks: Dispatcher | None = None,
        hook_run: HookRun | None = None,
    ) -> None:
        server = server or ServerLimits()
        self.request = request
        self.limits: RunLimits = run_limits(request, server)
        self._timeouts: ToolTimeouts | None = None
        self.fail_on_tool_error = request.tool_failure_mode == FAIL
        self.truncate = request.truncation == AUTO
        # Only truncation AUTO looks at the window.
        self.window_limits = server.context if self.truncate else windows.UNLIMITED
        self.hooks = hooks if hooks is not None and hooks.hooks else None
        self.hook_run = hook_run or (HookRun(Caller(), pb.HookContext()) if self.hooks else None)
        self.metrics = RunRecorder()
        # The most items any model call left out.
        self.omitted = 0
        # Calls cancelled by their timeout (their tool event says so).
        self.timed_out: set[str] = set()
        # The next model call's hooks, asked ahead (with the before-response hooks, or with the
        # after-tool hooks of a turn's one call): its turn, the call asked about, the answer.
        self._ahead: tuple[int, pb.ModelCall, Paused | ModelDecision] | None = None
        # Before-tool decisions asked ahead, with the approvals.
        self._decided: dict[str, ToolDecision] = {}
        # The first executed call that failed, when the failure mode is FAIL.
        self.failed_call: tuple[pb.FunctionCall, pb.FunctionCallOutput] | None = None
        self._clock: asyncio.TimerHandle | None = None
        self._model_started = 0.0
        self._usage_before = (0, 0, 0)
        # The final metrics are in the response.
        self.written = False

    def bind(self, response: pb.Response) -> None:
        """The response this run builds: hooks learn its id, model and metadata."""
        if self.request.truncation:
            response.truncation = self.request.truncation
        if self.hook_run is not None:
            context = self.hook_run.context
            context.response_id = response.id
            context.model = response.model
            context.previous_response_id = response.previous_response_id
            context.metadata.update(response.metadata)

    # -- hooks ----------------------------------------------------------------------------------

    def wants(self, point: int) -> bool:
        return self.hooks is not None and self.hooks.wants(point)

    @property
    def asked_before_model(self) -> bool:
        """Whether hooks are asked before a model call (a pause check or before-model hooks)."""
        return self.hooks is not None and (
            self.hooks.wants(P.HOOK_POINT_BEFORE_MODEL) or self.hooks.wants(P.HOOK_POINT_PAUSE_CHECK)
        )

    def early(self, request: TurnRequest) -> TurnRequest | None:
        """The first model call, if it may start before anything else: no hook is asked before
        it, or they were asked ahead about this very call and neither paused nor answered it."""
        if not self.asked_before_model:
            return request
        decision = self._asked_ahead(1, _model_call(request)) if self._ahead is not None else None
        if decision is None or isinstance(decision, Paused) or decision.answer is not None:
            return None  # the turn boundary takes it
        self._ahead = None
        return _apply(request, decision.call)

    def hook_events(self, emitter: ResponseEmitter) -> list[pb.StreamEvent]:
        """`hook_failed` events for the fail-open failures since the last call; HookFailed when a
        fail-closed hook could not see an observation sent on its own."""
        if self.hook_run is None:
            return []
        self.hook_run.raise_closed()
        if not self.hook_run.failures:
            return []
        return [emitter.hook_failed(_event(f)) for f in self.hook_run.take_failures()]

    def _turn(self, turn: int) -> HookRun:
        assert self.hooks is not None and self.hook_run is not None
        self.hook_run.context.turn = turn
        return self.hook_run

    @property
    def pauses(self) -> bool:
        return self.wants(P.HOOK_POINT_PAUSE_CHECK)

    def flush(self) -> None:
        """The run is about to wait (on the model, tools, a client): observations held for a
        hook's next exchange go now."""
        if self.hook_run is not None and self.hook_run.held:
            assert self.hooks is not None
            self.hooks.flush(self.hook_run)

    async def after_response(self, response: pb.Response) -> Failed | None:
        """Audit hooks see the response as it ends, and every observation is delivered; a
        fail-closed failure fails the response instead."""
        assert self.hooks is not None and self.hook_run is not None
        try:
            await self.hooks.after_response(self.hook_run, response)
        except HookFailed as failed:
            return Failed("hook_failed", str(failed))
        finally:
            # The audit call itself counts too: the metrics were written before it.
            self.write(response)
        return None

    # -- limits ---------------------------------------------------------------------------------

    def start_clock(self, stop: Any) -> None:
        """Call `stop("max_duration")` when the response's wall time limit passes."""
        if self.limits.max_duration is not None:
            self._clock = asyncio.get_running_loop().call_later(self.limits.max_duration, stop, "max_duration")

    def stop_clock(self) -> None:
        if self._clock is not None:
            self._clock.cancel()

    def limit_reached(self, turns_done: int, response: pb.Response) -> str | None:
        """At a turn boundary: the limit that ends the response before another turn, if any."""
        if turns_done >= self.limits.max_turns:
            return "max_turns"
        if output_tokens_spent(self.limits, response.usage.output_tokens):
            return "max_output_tokens"
        return None

    def tool_calls_exceed(self, calls: Sequence[pb.FunctionCall], server_side: frozenset[str]) -> bool:
        """Before calls start: whether running these would go past the tool call limit."""
        if self.limits.max_tool_calls is None:
            return False
        planned = sum(1 for c in calls if c.name in server_side)
        return self.metrics.tool_calls + planned > self.limits.max_tool_calls

    # -- the model ------------------------------------------------------------------------------

    def context(self, items: Sequence[pb.Item], instructions: str) -> tuple[pb.Item, ...]:
        """What the model sees of the conversation (truncation AUTO: the window)."""
        if not self.truncate or self.window_limits.unlimited:
            return tuple(items)
        window = windows.apply_window(items, instructions, self.window_limits)
        self.omitted = max(self.omitted, window.omitted)
        return tuple(window.items)

    def output_budget(self, per_call: int | None, response: pb.Response) -> int | None:
        return output_budget(self.limits, per_call, response.usage.output_tokens)

    async def admit(
        self,
        request: pb.CreateResponseRequest,
        problems: Callable[[pb.CreateResponseRequest], list[str]],
        first: TurnRequest | None,
    ) -> pb.CreateResponseRequest:
        """The before-response hooks: the request to run (HookRejected, HookFailed to refuse it).
        `first`: the first model call, when the response starts with one: its hooks are asked
        ahead, in the same exchange, and their answer kept for that call if nothing changed."""
        assert self.hooks is not None and self.hook_run is not None
        if first is None:
            return await self.hooks.before_response(self.hook_run, request, problems)
        call = _model_call(first)
        admitted, ahead = await self.hooks.admit(self.hook_run, request, problems, call, self.pauses)
        if ahead is not None:
            self._ahead = (1, call, ahead)
        return admitted

    async def before_model(self, turn: int, request: TurnRequest, pause: bool) -> Paused | TurnRequest | Completion:
        """At a turn boundary: a hook's pause (when `pause`: not asked yet at this boundary), the
        call to make (changed by hooks), or a hook's answer in the model's place."""
        # The first check at this boundary: an answer asked ahead may be for this very call.
        first_check = pause
        pause = pause and self.pauses
        if not (pause or self.wants(P.HOOK_POINT_BEFORE_MODEL)):
            return request
        assert self.hooks is not None
        call = _model_call(request)
        decision = self._asked_ahead(turn, call) if first_check else None
        self._ahead = None  # asked about once: whatever comes next is asked again
        if decision is None:
            decision = await self.hooks.model_turn(self._turn(turn), call, turn, pause)
        if isinstance(decision, Paused):
            return decision
        if decision.answer is not None:
            return Completion(decision.answer)
        return _apply(request, decision.call)

    def _asked_ahead(self, turn: int, call: pb.ModelCall) -> Paused | ModelDecision | None:
        """The answer asked ahead, if it was this very call that was asked about."""
        if self._ahead is None:
            return None
        asked_turn, asked, decision = self._ahead
        return decision if turn == asked_turn and asked == call else None

    def model_started(self, usage: pb.Usage) -> None:
        self._model_started = time.perf_counter()
        self._usage_before = (usage.input_tokens, usage.output_tokens, usage.total_tokens)

    def model_ended(self, turn: int, output: Sequence[pb.Item], usage: pb.Usage, by_hook: bool) -> None:
        """After each model call: its metrics, then the after-model hooks."""
        before = self._usage_before
        spent = (usage.input_tokens - before[0], usage.output_tokens - before[1], usage.total_tokens - before[2])
        self.metrics.turns = turn
        self.metrics.model_call(turn, spent, time.perf_counter() - self._model_started, by_hook=by_hook)
        if self.wants(P.HOOK_POINT_AFTER_MODEL):
            assert self.hooks is not None
            usage_spent = pb.Usage(input_tokens=spent[0], output_tokens=spent[1], total_tokens=spent[2])
            self.hooks.after_model(self._turn(turn), output, usage_spent)

    def stream(self, provider: Provider, request: TurnRequest) -> AsyncIterator[ProviderEvent]:
        if not self.truncate:
            return aiter(provider.stream(request))
        return self._stream_retrying(provider, request)

    async def _stream_retrying(self, provider: Provider, request: TurnRequest) -> AsyncIterator[ProviderEvent]:
        """The backend said the context is too long: once more, with a smaller window."""
        stream = aiter(provider.stream(request))
        try:
            first = await anext(stream)
        except ProviderError as err:
            if err.code != CONTEXT_LENGTH_EXCEEDED:
                raise
            await _close(stream)
            stream = aiter(provider.stream(self._smaller(request)))
            try:
                first = await anext(stream)
            except StopAsyncIteration:
                return
        except StopAsyncIteration:
            return
        try:
            yield first
            async for event in stream:
                yield event
        finally:
            await _close(stream)

    async def complete(self, provider: Provider, request: TurnRequest) -> Completion:
        if not self.truncate:
            return await provider.complete(request)
        try:
            return await provider.complete(request)
        except ProviderError as err:
            if err.code != CONTEXT_LENGTH_EXCEEDED:
                raise
            return await provider.complete(self._smaller(request))

    def _smaller(self, request: TurnRequest) -> TurnRequest:
        sent = windows.apply_window(request.items, request.instructions, windows.WindowLimits())
        self.window_limits = windows.smaller(self.window_limits, sent)
        window = windows.apply_window(request.items, request.instructions, self.window_limits)
        self.omitted = max(self.omitted, window.omitted)
        return dataclasses.replace(request, items=tuple(window.items))

    # -- tools ----------------------------------------------------------------------------------

    async def before_tools(
        self, calls: list[pb.FunctionCall], routes: Mapping[str, Route], pause: bool
    ) -> Paused | tuple[list[pb.FunctionCall], list[pb.FunctionCallOutput], set[str]]:
        """Before a turn's calls start: a hook's pause (when `pause`), else the approve-tool hooks
        on each call: the calls still in play, the outputs of those denied, and the ids of those
        approved (they wait for no client decision). The before-tool hooks of the calls that will
        run at once are asked in the same exchange; `run_tool` uses their decisions."""
        pause = pause and self.pauses
        approving = self.wants(P.HOOK_POINT_APPROVE_TOOL)
        if not (pause or approving or self.wants(P.HOOK_POINT_BEFORE_TOOL)):
            return calls, [], set()
        assert self.hooks is not None and self.hook_run is not None

        def ahead(call: pb.FunctionCall) -> bool:
            route = routes[call.name]
            return route.executor is not None and not needs_approval(call.name, route.tool)

        routed = [(call, routes[call.name].tool) for call in calls]
        decided = await self.hooks.before_tools(self.hook_run, routed, pause, ahead)
        if isinstance(decided, Paused):
            return decided
        self._decided.update(decided.decided)
        kept: list[pb.FunctionCall] = []
        denied: list[pb.FunctionCallOutput] = []
        approved: set[str] = set()
        for call in calls:
            approval = decided.approvals.get(call.call_id)
            if approval is not None and not approval.approved:
                reason = f"denied by hook {approval.hook}" + (f": {approval.reason}" if approval.reason else "")
                denied.append(pb.FunctionCallOutput(call_id=call.call_id, output=reason, is_error=True))
                continue
            if approval is not None:
                approved.add(call.call_id)
            kept.append(call)
        return kept, denied, approved

    async def run_tool(
        self, call: pb.FunctionCall, route: Route, progress: ProgressSink, following: Following | None = None
    ) -> pb.FunctionCallOutput:
        """One server-side call: before-tool hooks, the executor within the call's timeout,
        after-tool hooks; every failure an is_error output. `following`: for a turn's one call,
        the next model call as it will be with this result (its hooks are asked ahead, with the
        after-tool hooks)."""
        result: pb.FunctionCallOutput | None = None
        decision = self._decided.pop(call.call_id, None)
        if decision is None and self.wants(P.HOOK_POINT_BEFORE_TOOL):
            assert self.hooks is not None and self.hook_run is not None
            decision = await self.hooks.before_tool(self.hook_run, call, route.tool)
        if decision is not None:
            call, result = decision.call, decision.result
        executed = result is None
        started = time.perf_counter()
        timed_out = False
        if result is None:
            result, timed_out = await self._execute(call, route, progress)
        seconds = time.perf_counter() - started
        result.call_id = call.call_id
        if self.wants(P.HOOK_POINT_AFTER_TOOL):
            fails = executed and result.is_error and self.fail_on_tool_error
            result = await self._after_tool(call, result, None if fails else following)
        self.metrics.tool_call(call.name, seconds, is_error=result.is_error, timed_out=timed_out)
        if executed and result.is_error and self.fail_on_tool_error and self.failed_call is None:
            self.failed_call = (call, result)
        return result

    async def _after_tool(
        self, call: pb.FunctionCall, result: pb.FunctionCallOutput, following: Following | None
    ) -> pb.FunctionCallOutput:
        assert self.hooks is not None and self.hook_run is not None
        ahead = following(result) if following is not None else None
        if ahead is None or not (self.pauses or self.wants(P.HOOK_POINT_BEFORE_MODEL)):
            return await self.hooks.after_tool(self.hook_run, call, result)
        turn, request = ahead
        model_call = _model_call(request)
        result, decided = await self.hooks.after_tool_ahead(
            self.hook_run, call, result, model_call, turn - 1, self.pauses
        )
        if decided is not None:
            self._ahead = (turn, model_call, decided)
        return result

    async def _execute(
        self, call: pb.FunctionCall, route: Route, progress: ProgressSink
    ) -> tuple[pb.FunctionCallOutput, bool]:
        executor = route.executor
        assert executor is not None
        advertised = executor.tool_timeout(call.name) if isinstance(executor, ToolTimeoutSource) else None
        if self._timeouts is None:
            self._timeouts = ToolTimeouts.of(self.request)
        timeout = self._timeouts.for_tool(call.name, advertised)
        try:
            # Cancelled all the way down on timeout: a remote executor sees its RPC cancelled.
            async with asyncio.timeout(timeout) as limit:
                return await executor.execute(call, route.tool, progress), False
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            if not limit.expired():
                return _error(call, f"tool {call.name!r} failed: TimeoutError"), False
            self.timed_out.add(call.call_id)
            return _error(call, f"tool {call.name!r} timed out after {timeout:g} s"), True
        except Exception as err:
            return _error(call, f"tool {call.name!r} failed: {err}"), False

    def tool_failure(self) -> Failed | None:
        """FAIL mode: the response's end after its first failed call."""
        if self.failed_call is None:
            return None
        call, result = self.failed_call
        return Failed("tool_failed", f"tool call {call.name!r} ({call.call_id}) failed: {result.output}")

    # -- the record -----------------------------------------------------------------------------

    def write(self, response: pb.Response) -> None:
        """Metrics and how much the model did not see, into the response (once, as it ends: the
        saves before then need not carry them)."""
        if self.hook_run is not None:
            self.metrics.hooks(self.hook_run.calls, self.hook_run.failed, self.hook_run.seconds)
        self.metrics.write(response.metrics)
        response.omitted_items = self.omitted
        self.written = True


def _event(failure: HookFailure) -> pb.HookFailedEvent:
    return pb.HookFailedEvent(hook=failure.hook, point=failure.point, error=failure.error, call_id=failure.call_id)  # type: ignore[arg-type]


def _error(call: pb.FunctionCall, message: str) -> pb.FunctionCallOutput:
    return pb.FunctionCallOutput(call_id=call.call_id, output=message, is_error=True)


def _model_call(request: TurnRequest) -> pb.ModelCall:
    call = pb.ModelCall(instructions=request.instructions, items=request.items, tools=request.tools)
    if request.temperature is not None:
        call.temperature = request.temperature
    if request.max_output_tokens is not None:
        call.max_output_tokens = request.max_output_tokens
    if request.tool_choice is not None:
        call.tool_choice.CopyFrom(request.tool_choice)
    return call


def _apply(request: TurnRequest, call: pb.ModelCall) -> TurnRequest:
    """The hooks' changes (instructions, temperature, offered tools, appended items)."""
    offered = {t.name for t in call.tools}
    return dataclasses.replace(
        request,
        instructions=call.instructions,
        temperature=call.temperature if call.HasField("temperature") else None,
        tools=[t for t in request.tools if t.name in offered],
        items=tuple(call.items),
    )


async def _close(stream: AsyncIterator[ProviderEvent]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await asyncio.shield(aclose())
