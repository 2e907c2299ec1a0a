"""The agentic loop: inference, tool calls, execution, results fed back, again.

`Engine.start` prepares a response and returns its `Run`; `run.events()` is the one code path for
both modes (the non-streaming RPC drains it and sends only the terminal event). Each turn ends in a
typed outcome (outcomes.py) chosen by pure policies; the loop matches on it.

Controls act at the check points: `_checkpoint` at every turn boundary (stop, pause, steering
messages), `_gate` before tool calls start (pause, approvals), and the model stream itself for a
steer (cut at once). `_call_model` is the one place the model is called.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

import grpc

from antwort_grpc import pb
from antwort_grpc.engine import continuation, policy, state
from antwort_grpc.engine.emitter import new_item_id
from antwort_grpc.engine.governor import Following, Governor
from antwort_grpc.engine.history import HISTORY_MAX_BYTES, History, load_history
from antwort_grpc.engine.limits import ServerLimits
from antwort_grpc.engine.outcomes import (
    Cancelled,
    Completed,
    ExecuteTools,
    Failed,
    FinalOutcome,
    Incomplete,
    RequiresAction,
)
from antwort_grpc.engine.request import input_items, new_response
from antwort_grpc.engine.run import APPROVAL, MODEL, PAUSE, TOOLS, Run
from antwort_grpc.engine.runs import RunRegistry
from antwort_grpc.engine.tools import ToolSet, resolve_tools
from antwort_grpc.errors import FieldViolation, RequestError, invalid_argument
from antwort_grpc.executors.base import ToolExecutor, current_deadline
from antwort_grpc.hooks.dispatch import Dispatcher, HookFailed, HookRejected, HookRun, Paused
from antwort_grpc.hooks.service import Point
from antwort_grpc.providers.base import (
    Completion,
    FinishReason,
    Provider,
    ProviderError,
    ProviderEvent,
    ReasoningDelta,
    RefusalDelta,
    TextDelta,
    ToolCallDelta,
    TurnEnd,
    TurnRequest,
)
from antwort_grpc.providers.coalesce import max_hold_of
from antwort_grpc.storage.base import ResponseStore, StoredResponse

log = logging.getLogger(__name__)

S = pb.ResponseStatus
# Enum values as plain ints: a protobuf enum attribute lookup is a Python-level call, and these are
# read on every response.
RESPOND: int = pb.TurnDecision.TURN_DECISION_RESPOND
CALL_TOOLS: int = pb.TurnDecision.TURN_DECISION_CALL_TOOLS
INTERRUPTED: int = pb.TurnDecision.TURN_DECISION_INTERRUPTED
STEER: int = pb.InputKind.INPUT_KIND_STEER
FOLLOW_UP: int = pb.InputKind.INPUT_KIND_FOLLOW_UP
ITEM_COMPLETED: int = pb.ItemStatus.ITEM_STATUS_COMPLETED
ITEM_INCOMPLETE: int = pb.ItemStatus.ITEM_STATUS_INCOMPLETE
COMPLETED: int = S.RESPONSE_STATUS_COMPLETED
REQUIRES_ACTION: int = S.RESPONSE_STATUS_REQUIRES_ACTION
INCOMPLETE: int = S.RESPONSE_STATUS_INCOMPLETE
FAILED: int = S.RESPONSE_STATUS_FAILED
CANCELLED: int = S.RESPONSE_STATUS_CANCELLED


@dataclass(slots=True)
class EngineConfig:
    # No executors: single-shot (tool calls are returned as they are, status completed).
    executors: Sequence[ToolExecutor] = ()
    max_turns: int = 10
    default_model: str = ""
    history_max_depth: int = 100
    # The most bytes of input and output a previous_response_id chain may hold.
    history_max_bytes: int = HISTORY_MAX_BYTES
    # How long a call waits for an approve/deny decision before it is denied with reason "timeout".
    approval_timeout: float = 300.0
    # The server's maximums of execution limits and the context window (max_turns above wins).
    limits: ServerLimits | None = None
    # Policy hooks; None: none are configured, and none are ever asked.
    hooks: Dispatcher | None = None


class _Stopped(Exception):
    """A cancel or deadline noticed at a check point (not during an interruptible wait)."""


class ModelCall:
    """One call of the model for one turn. A streaming call starts at once: its first delta is
    awaited in a task of its own, so the backend's round trip overlaps whatever the loop writes
    before it reads the stream."""

    __slots__ = ("answered", "completion", "first", "stream")

    def __init__(
        self, stream: AsyncIterator[ProviderEvent] | None = None, completion: Awaitable[Completion] | None = None
    ) -> None:
        self.stream = stream
        self.completion = completion
        self.first: asyncio.Task[ProviderEvent] | None = None
        # A before-model hook's answer, not the model's.
        self.answered = False
        if stream is not None:
            self.first = asyncio.create_task(_next_delta(stream))

    async def discard(self) -> None:
        """Abandon it unread (the run stopped, failed or was steered before reading it)."""
        if self.first is not None:
            self.first.cancel()
            await asyncio.gather(self.first, return_exceptions=True)
        if self.stream is not None:
            await _close(self.stream)
        if asyncio.iscoroutine(self.completion):
            self.completion.close()


class Engine:
    def __init__(self, provider: Provider, store: ResponseStore, config: EngineConfig | None = None) -> None:
        self.provider = provider
        self.store = store
        self.config = config or EngineConfig()
        self.runs = RunRegistry()
        self.server_limits = dataclasses.replace(self.config.limits or ServerLimits(), max_turns=self.config.max_turns)

    # -- the public entry points ----------------------------------------------------------------

    async def start(
        self,
        request: pb.CreateResponseRequest,
        *,
        owner: str = "",
        timeout: float | None = None,
        controller: bool = False,
        hook_run: HookRun | None = None,
        problems: Callable[[pb.CreateResponseRequest], list[str]] = lambda _: [],
    ) -> Run:
        """Prepare and store a new response; iterate `run.events()` to run it. Raises RequestError
        (and nothing is stored) when it cannot start. The request is expected to have passed
        `responses.validation` (the responses layer does that for every front door; `problems`
        is that validation, for a request a before-response hook returns).

        `controller`: a client stays attached that can decide approvals while the run waits."""
        run = await self._admit(request, owner, controller, hook_run, problems)
        # Stored before the client learns the id: from then on any replica can read or cancel
        # it, and a crash leaves it to be found and marked interrupted.
        await self._save(run, required=True)
        self.runs.add(run)
        if timeout is not None:
            loop = asyncio.get_running_loop()
            # Stop a little early so the failed event still reaches the client in time.
            run.set_deadline(loop.time() + timeout - min(0.5, timeout * 0.1))
            run.deadline = loop.time() + timeout
        run.bind(self._drive)
        return run

    async def run(
        self, request: pb.CreateResponseRequest, *, owner: str = "", timeout: float | None = None
    ) -> AsyncIterator[pb.StreamEvent]:
        """`start` and `events` in one: every event of one response."""
        run = await self.start(request, owner=owner, timeout=timeout)
        async with contextlib.aclosing(run.events()) as events:
            async for event in events:
                yield event

    async def cancel(self, response_id: str) -> bool:
        """Stop a response running in this process; False if none is."""
        return self.runs.stop(response_id, "cancelled")

    # -- preparation (errors here become gRPC statuses) -----------------------------------------

    async def _admit(
        self,
        request: pb.CreateResponseRequest,
        owner: str,
        controller: bool,
        hook_run: HookRun | None,
        problems: Callable[[pb.CreateResponseRequest], list[str]],
    ) -> Run:
        """The response prepared and past the before-response hooks, which may refuse the request
        (PERMISSION_DENIED; UNAVAILABLE when a fail-closed hook failed) or change it (prepared
        again, under the same id). A request that cannot be prepared still goes to the hooks
        first: one may make it one that can."""
        hooks = self.config.hooks
        if hook_run is None or hooks is None or not hooks.wants(Point.HOOK_POINT_BEFORE_RESPONSE):
            return await self._prepare(request, owner, controller, hook_run)
        run: Run | None = None
        with contextlib.suppress(RequestError):
            run = await self._prepare(request, owner, controller, hook_run)
        try:
            if run is None:
                admitted = await hooks.before_response(hook_run, request, problems)
            else:
                admitted = await run.governor.admit(request, problems, self._first_call(run))
        except HookRejected as rejected:
            raise RequestError(grpc.StatusCode.PERMISSION_DENIED, str(rejected), reason="hook_rejected") from None
        except HookFailed as failed:
            raise RequestError(grpc.StatusCode.UNAVAILABLE, str(failed), reason="hook_failed") from None
        if run is not None and admitted is request:
            return run
        return await self._prepare(admitted, owner, controller, hook_run, run.response.id if run else "")

    def _first_call(self, run: Run) -> TurnRequest | None:
        """The first model call, when the response starts with one (not with calls to run)."""
        resumed = run.continuation
        if self.config.max_turns <= 0 or resumed.calls or resumed.outputs or resumed.handoff:
            return None
        if not run.governor.asked_before_model:
            return None
        return self._turn_request(run, 1)

    async def _prepare(
        self,
        request: pb.CreateResponseRequest,
        owner: str,
        controller: bool,
        hook_run: HookRun | None = None,
        response_id: str = "",
    ) -> Run:
        model = request.model or self.config.default_model
        if not model:
            raise invalid_argument([FieldViolation("model", "required: no default model is configured")])
        history = History()
        if request.previous_response_id:
            history = await load_history(
                self.store,
                request.previous_response_id,
                owner=owner,
                max_depth=self.config.history_max_depth,
                max_bytes=self.config.history_max_bytes,
            )
        items = input_items(request)
        tools = await resolve_tools(request.tools, self.config.executors)
        choice = request.tool_choice if request.HasField("tool_choice") else None
        _check_choice_names(choice, tools)
        resumed, violations = continuation.resolve(history.items, history.model_call_ids, items, tools, choice)
        if violations:
            raise invalid_argument(violations)
        response = new_response(request, model)
        if response_id:
            response.id = response_id
        return Run(
            request,
            response,
            items,
            history.items + items,
            tools,
            owner,
            controller=controller,
            # An engine without executors is single-shot: it runs nothing of an earlier response.
            continuation=resumed if self.config.executors else None,
            governor=Governor(request, self.server_limits, self.config.hooks, hook_run),
        )

    # -- one response ---------------------------------------------------------------------------

    async def _drive(self, run: Run) -> AsyncGenerator[pb.StreamEvent, None]:
        run.task = asyncio.current_task()
        if run.deadline is not None:
            current_deadline.set(run.deadline)
        emitter = run.emitter
        finished = False
        try:
            resumed = run.continuation
            run.governor.start_clock(run.stop)
            if (
                run.request.stream
                and self.config.max_turns > 0
                and not (resumed.calls or resumed.outputs or resumed.handoff)
            ):
                # The model is asked now: its round trip overlaps the writes of the two events below.
                first = run.governor.early(self._turn_request(run, 1))
                if first is not None:
                    run.early = self._call_model(run, 1, first)
            yield emitter.created()
            yield emitter.in_progress()
            for event in run.governor.hook_events(emitter):
                yield event
            try:
                async for event in self._turns(run):
                    yield event
            except asyncio.CancelledError:
                if not run.stop_requested:
                    raise
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
                run.outcome = _stop_outcome(run)
            except _Stopped:
                run.outcome = _stop_outcome(run)
            except ProviderError as err:
                log.warning("response %s: provider error %s: %s", run.response_id, err.code, err.message)
                run.outcome = Failed(err.code, err.message)
            except HookFailed as err:
                run.outcome = Failed("hook_failed", str(err))
            except Exception as err:
                log.exception("response %s failed", run.response_id)
                run.outcome = Failed("internal_error", f"{type(err).__name__}: {err}")
            for event in emitter.close_turn(ITEM_INCOMPLETE):
                yield event
            run.governor.stop_clock()
            self._finish(run)
            run.governor.write(run.response)
            failed = await run.governor.after_response(run.response) if run.governor.hooks else None
            if failed is not None:
                # A fail-closed audit hook that could not see the response: it fails instead.
                run.response.status = S.RESPONSE_STATUS_IN_PROGRESS
                run.response.ClearField("incomplete_details")
                run.outcome = failed
                self._finish(run)
            for event in run.governor.hook_events(emitter):
                yield event
            await asyncio.shield(self._save(run))
            finished = True
            yield emitter.terminal(*_handed_out(run.outcome))
        finally:
            try:
                if run.early is not None:
                    early, run.early = run.early, None
                    await asyncio.shield(early.discard())
                if not finished:
                    # The client went away (or the server is shutting down): keep what was done.
                    if run.response.status not in state.TERMINAL:
                        emitter.close_turn(ITEM_INCOMPLETE)
                        run.outcome = Cancelled()
                        self._finish(run)
                    await asyncio.shield(self._save(run))
            finally:
                run.governor.stop_clock()
                self.runs.finish(run)

    async def _turns(self, run: Run) -> AsyncIterator[pb.StreamEvent]:
        request = run.request
        emitter = run.emitter
        choice = request.tool_choice if request.HasField("tool_choice") else None
        loop_enabled = bool(self.config.executors)
        resumed = run.continuation
        if resumed.calls or resumed.outputs:
            async for event in self._execute(run, ExecuteTools(resumed.calls, resumed.outputs)):
                yield event
            await self._save(run)
            if (failure := run.governor.tool_failure()) is not None:
                run.outcome = failure
                return
        if resumed.handoff:
            run.outcome = RequiresAction(resumed.handoff)
            return
        clock = asyncio.get_running_loop()
        while True:
            async for event in self._checkpoint(run):
                yield event
            if (reason := run.governor.limit_reached(run.turn, run.response)) is not None:
                run.outcome = Incomplete(reason)
                return
            run.turn += 1
            turn = run.turn
            began = clock.time()
            call, run.early = run.early, None
            if call is None and not run.governor.asked_before_model:
                call = self._call_model(run, turn)
            if call is None:
                async for opened in self._model_call(run, turn):
                    if isinstance(opened, ModelCall):
                        call = opened
                    else:
                        yield opened
            assert call is not None
            yield emitter.turn_started(turn, run.round)
            emitter.start_turn()
            finish: FinishReason | None = FinishReason.STOP
            if call.stream is not None:
                async for step in self._stream_turn(run, call):
                    if step is None or isinstance(step, FinishReason):
                        finish = step
                    else:
                        yield step
            else:
                finish = None
                completion = await self._await_completion(run, call)
                if completion is not None:
                    _add_usage(run.response, completion.usage)
                    finish = completion.finish
                    for item in completion.items:
                        for event in emitter.add_item(item):
                            yield event
            produced = list(emitter.turn_items)
            run.context += produced
            run.governor.model_ended(turn, produced, run.response.usage, call.answered)
            for event in run.governor.hook_events(emitter):
                yield event
            calls = [i.function_call for i in produced if i.WhichOneof("kind") == "function_call"]
            if finish is None:
                # Cut short by a steering message: its calls never run.
                yield emitter.turn_decided(turn, INTERRUPTED, len(calls))
                for event in self._supersede(run, calls):
                    yield event
                yield emitter.turn_completed(turn, clock.time() - began)
                continue
            screened = policy.screen_turn(
                finish=finish, calls=calls, choice=choice, loop_enabled=loop_enabled, known=run.tools.routes
            )
            decision = CALL_TOOLS if calls else RESPOND
            yield emitter.turn_decided(turn, decision, len(calls))
            if isinstance(screened, Completed) and (run.steer or run.follow_ups):
                # Not the end yet: a steering message that came during the answer is answered
                # next; otherwise the next follow-up starts a new round.
                yield emitter.turn_completed(turn, clock.time() - began)
                if not run.steer:
                    run.round += 1
                    for event in self._inject(run, FOLLOW_UP, run.follow_ups.pop(0)):
                        yield event
                continue
            if isinstance(screened, Completed | Incomplete):
                yield emitter.turn_completed(turn, clock.time() - began)
                run.outcome = screened
                return
            if run.governor.tool_calls_exceed(screened.accepted, run.tools.server_side):
                for event in self._add_outputs(run, screened.rejected):
                    yield event
                yield emitter.turn_completed(turn, clock.time() - began)
                run.outcome = Incomplete("max_tool_calls")
                return
            # Before the calls start: pause, then approvals.
            async for event in self._checkpoint(run, inject=False):
                yield event
            outcome: RequiresAction | ExecuteTools | None = None
            async for gated in self._gate(run, screened):
                if isinstance(gated, RequiresAction | ExecuteTools):
                    outcome = gated
                else:
                    yield gated
            assert outcome is not None
            if isinstance(outcome, RequiresAction):
                for event in self._add_outputs(run, outcome.rejected):
                    yield event
                yield emitter.turn_completed(turn, clock.time() - began)
                run.outcome = outcome
                return
            async for event in self._execute(run, outcome):
                yield event
            # Tool results can be expensive to redo: a crash from here on keeps them.
            await self._save(run)
            yield emitter.turn_completed(turn, clock.time() - began)
            if (failure := run.governor.tool_failure()) is not None:
                run.outcome = failure
                return

    # -- the model --------------------------------------------------------------------------------

    def _call_model(self, run: Run, turn: int, request: TurnRequest | None = None) -> ModelCall:
        """The one place the model is called."""
        request = request or self._turn_request(run, turn)
        run.governor.flush()
        run.governor.model_started(run.response.usage)
        if run.request.stream:
            return ModelCall(stream=run.governor.stream(self.provider, request))
        return ModelCall(completion=run.governor.complete(self.provider, request))

    async def _model_call(self, run: Run, turn: int) -> AsyncIterator[pb.StreamEvent | ModelCall]:
        """Hooks first, with the call (yielded last): a hook's pause check for this boundary
        (the run waits here, then the call is rebuilt), then the before-model hooks, which may
        change the call or answer in the model's place."""
        pause = True
        while True:
            decided = await run.governor.before_model(turn, self._turn_request(run, turn), pause)
            for event in run.governor.hook_events(run.emitter):
                yield event
            if not isinstance(decided, Paused):
                break
            run.pause_reason, pause = decided.reason, False
            async for event in self._checkpoint(run):
                yield event
        if isinstance(decided, Completion):
            run.governor.model_started(run.response.usage)
            call = ModelCall(completion=_given(decided))
            call.answered = True
            yield call
            return
        yield self._call_model(run, turn, decided)

    def _turn_request(self, run: Run, turn: int, context: Sequence[pb.Item] | None = None) -> TurnRequest:
        request = run.request
        choice = request.tool_choice if request.HasField("tool_choice") else None
        return TurnRequest(
            model=run.response.model,
            instructions=request.instructions,
            items=run.governor.context(run.context if context is None else context, request.instructions),
            tools=run.tools.functions,
            tool_choice=policy.turn_tool_choice(choice, turn),
            parallel_tool_calls=run.response.parallel_tool_calls,
            max_output_tokens=run.governor.output_budget(
                request.max_output_tokens if request.HasField("max_output_tokens") else None, run.response
            ),
            temperature=request.temperature if request.HasField("temperature") else None,
            top_p=request.top_p if request.HasField("top_p") else None,
            coalesce=not request.delta_coalescing.disabled,
            max_hold=max_hold_of(request),
        )

    async def _await_completion(self, run: Run, call: ModelCall) -> Completion | None:
        """A non-streaming turn; None when a steering message cut it short."""
        assert call.completion is not None
        run.waiting = MODEL
        try:
            return await call.completion
        except asyncio.CancelledError:
            if not _steered(run):
                raise
            return None
        finally:
            run.waiting = None

    async def _stream_turn(self, run: Run, call: ModelCall) -> AsyncIterator[pb.StreamEvent | FinishReason | None]:
        """The turn's events, then its FinishReason (None: a steering message cut it short)."""
        emitter = run.emitter
        stream = call.stream
        assert stream is not None
        first, call.first = call.first, None
        try:
            while True:
                if run.attention:
                    if run.reason:
                        raise _Stopped
                    if run.steer:
                        for event in emitter.close_turn(ITEM_INCOMPLETE):
                            yield event
                        yield None
                        return
                run.waiting = MODEL
                try:
                    if first is not None:
                        # Awaiting the task directly: cancelling this task cancels it too.
                        pending, first = first, None
                        delta = await pending
                    else:
                        # Inline rather than `_next_delta`: this runs once per delta.
                        try:
                            delta = await anext(stream)
                        except StopAsyncIteration:
                            raise ProviderError(
                                "backend_protocol_error", "the model stream ended without a finish"
                            ) from None
                except asyncio.CancelledError:
                    if not _steered(run):
                        raise
                    continue  # the check above ends the turn
                finally:
                    run.waiting = None
                if isinstance(delta, TextDelta):
                    events = emitter.on_text(delta.text)
                elif isinstance(delta, ToolCallDelta):
                    events = emitter.on_tool_call(delta.index, delta.call_id, delta.name, delta.arguments)
                elif isinstance(delta, ReasoningDelta):
                    events = emitter.on_reasoning(delta.text)
                elif isinstance(delta, RefusalDelta):
                    events = emitter.on_refusal(delta.text)
                else:
                    assert isinstance(delta, TurnEnd)
                    _add_usage(emitter.response, delta.usage)
                    status = ITEM_INCOMPLETE if delta.finish is FinishReason.LENGTH else ITEM_COMPLETED
                    for event in emitter.close_turn(status):
                        yield event
                    yield delta.finish
                    return
                for event in events:
                    yield event
        finally:
            if first is not None:
                # Ended before the early first delta was read (a stop while writing events).
                first.cancel()
                await asyncio.gather(first, return_exceptions=True)
            await _close(stream)

    # -- check points -----------------------------------------------------------------------------

    async def _checkpoint(self, run: Run, *, inject: bool = True) -> AsyncIterator[pb.StreamEvent]:
        """A stop ends the run here; a pause waits here for resume; steering messages join here
        (at a turn boundary)."""
        if run.reason:
            raise _Stopped
        if run.pause_reason is not None:
            run.paused = True
            run.governor.flush()
            yield run.emitter.paused(run.pause_reason)
            while run.pause_reason is not None:
                run.waiting = PAUSE
                try:
                    await run.wake()
                finally:
                    run.waiting = None
            run.paused = False
            yield run.emitter.resumed()
        if inject and run.steer:
            if run.early is not None:
                # Asked before the steering message came: the model must see it.
                early, run.early = run.early, None
                await early.discard()
            for event in self._inject(run, STEER, run.take_steer()):
                yield event

    def _inject(self, run: Run, kind: int, items: list[pb.Item]) -> list[pb.StreamEvent]:
        """Items added to the conversation while it runs: output items of the response (so a
        continuation rebuilds the same context), announced by input_injected."""
        emitter = run.emitter
        emitter.start_turn()
        events: list[pb.StreamEvent] = []
        for item in items:
            events += emitter.add_item(item)
        run.context += emitter.turn_items
        events.append(emitter.input_injected(kind, list(emitter.turn_items), run.superseded))
        run.superseded = []
        return events

    def _supersede(self, run: Run, calls: Sequence[pb.FunctionCall]) -> list[pb.StreamEvent]:
        """Calls that will not run because a steering message came: each still gets its output
        before the injected message, so the history stays valid for Chat Completions backends."""
        return self._add_outputs(run, self._supersede_outputs(run, list(calls)))

    async def _gate(
        self, run: Run, screened: policy.Screened
    ) -> AsyncIterator[pb.StreamEvent | RequiresAction | ExecuteTools]:
        """Approvals before the calls start; then where the turn goes (yielded last)."""
        accepted, rejected = list(screened.accepted), list(screened.rejected)
        routes = run.tools.routes
        server_side = run.tools.server_side
        pause = True
        while True:
            if run.steer:
                # A steering message came before the calls started: none of them runs.
                yield ExecuteTools([], rejected + self._supersede_outputs(run, accepted))
                return
            # A hook's pause check, then approve-tool hooks decide first, on the same path as a
            # client's decision.
            gated = await run.governor.before_tools(accepted, routes, pause)
            for event in run.governor.hook_events(run.emitter):
                yield event
            if not isinstance(gated, Paused):
                break
            run.pause_reason, pause = gated.reason, False
            async for event in self._checkpoint(run, inject=False):
                yield event
        accepted, denied, hook_approved = gated
        rejected += denied
        waiting = [
            c for c in accepted if c.call_id not in hook_approved and policy.needs_approval(c.name, routes[c.name].tool)
        ]
        if not waiting:
            yield policy.route_calls(accepted, rejected, server_side)
            return
        requests = [_approval_request(c, routes[c.name].tool) for c in waiting]
        emitter = run.emitter
        emitter.start_turn()
        for request in requests:
            for event in emitter.add_item(pb.Item(approval_request=request)):
                yield event
        run.context += emitter.turn_items
        # A decision may come the moment the event is out, before this generator resumes.
        run.awaiting = {r.call_id: r for r in requests} if run.controller else {}
        yield emitter.approval_requested(requests)
        if not run.controller:
            # Nobody can decide now: the response pauses; the client continues it with
            # approval_response items (calls that need no approval run then too).
            free = [c for c in accepted if c not in waiting and c.name not in server_side]
            yield RequiresAction(free, rejected, requests)
            return
        async for event in self._await_decisions(run, requests):
            yield event
        if run.steer:
            yield ExecuteTools([], rejected + self._supersede_outputs(run, accepted))
            return
        undecided = [r for r in requests if r.call_id not in run.decisions]
        decisions, run.decisions, run.awaiting = run.decisions, {}, {}
        approved: list[pb.FunctionCall] = []
        for call in accepted:
            decision = decisions.get(call.call_id)
            if call.call_id in {r.call_id for r in undecided}:
                continue
            if decision is not None and not decision.approve:
                rejected.append(policy.denied_output(call, decision.reason))
            else:
                approved.append(call)
        if undecided:
            # The controlling client went away: the rest is decided with a continuation.
            yield RequiresAction([c for c in approved if c.name not in server_side], rejected, undecided)
            return
        yield policy.route_calls(approved, rejected, server_side)

    def _supersede_outputs(self, run: Run, calls: list[pb.FunctionCall]) -> list[pb.FunctionCallOutput]:
        run.superseded += [c.call_id for c in calls]
        run.decisions, run.awaiting = {}, {}
        return [policy.error_output(c, policy.SUPERSEDED) for c in calls]

    async def _await_decisions(self, run: Run, requests: list[pb.ApprovalRequest]) -> AsyncIterator[pb.StreamEvent]:
        """Wait until every request is decided (each decision is recorded as an approval_response
        output item when it arrives), a steering message comes, the approval timeout passes
        (undecided ones are denied with reason "timeout"), or the controlling client goes away."""
        run.awaiting = {r.call_id: r for r in requests}
        run.governor.flush()
        emitter = run.emitter
        timeout_at = asyncio.get_running_loop().time() + self.config.approval_timeout
        recorded: set[str] = set()
        while True:
            for call_id, decision in list(run.decisions.items()):
                if call_id not in recorded:
                    recorded.add(call_id)
                    emitter.start_turn()
                    for event in emitter.add_item(pb.Item(approval_response=decision)):
                        yield event
                    run.context += emitter.turn_items
            if len(recorded) == len(requests) or run.steer or not run.controller:
                return
            run.waiting = APPROVAL
            try:
                woke = await run.wake(timeout_at)
            finally:
                run.waiting = None
            if not woke:
                for call_id in run.awaiting:
                    run.decisions.setdefault(call_id, pb.ApprovalResponse(call_id=call_id, reason="timeout"))

    # -- tools ------------------------------------------------------------------------------------

    async def _execute(self, run: Run, plan: ExecuteTools) -> AsyncIterator[pb.StreamEvent]:
        """Run a turn's server-side calls concurrently; outputs go back in the model's order."""
        run.governor.flush()
        emitter = run.emitter
        items = {i.function_call.call_id: (i, n) for n, i in enumerate(run.response.output)}
        queue: asyncio.Queue[tuple[int, str | pb.FunctionCallOutput]] = asyncio.Queue()
        results: dict[int, pb.FunctionCallOutput] = {}
        tasks: list[asyncio.Task[None]] = []

        following = self._following(run, plan)

        async def one(position: int, call: pb.FunctionCall) -> None:
            route = run.tools.routes[call.name]
            result = await run.governor.run_tool(call, route, lambda m: queue.put_nowait((position, m)), following)
            queue.put_nowait((position, result))

        for position, call in enumerate(plan.calls):
            if call.call_id in items:
                item, index = items[call.call_id]
                yield emitter.tool_started(item, index)
            tasks.append(asyncio.create_task(one(position, call)))
        try:
            while len(results) < len(tasks):
                run.waiting = TOOLS
                try:
                    position, update = await queue.get()
                finally:
                    run.waiting = None
                call = plan.calls[position]
                found = items.get(call.call_id)
                if isinstance(update, str):
                    if found:
                        yield emitter.tool_progress(found[0], found[1], update)
                    continue
                results[position] = update
                if found:
                    yield emitter.tool_finished(found[0], found[1], update, call.call_id in run.governor.timed_out)
                for event in run.governor.hook_events(emitter):
                    yield event
                if run.reason:
                    raise _Stopped
                if run.governor.failed_call is not None:
                    break  # FAIL mode: the calls still running are cancelled; outputs so far kept
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        outputs = [results[p] for p in range(len(plan.calls)) if p in results]
        for event in self._add_outputs(run, _in_model_order(run, outputs + list(plan.rejected))):
            yield event

    def _following(self, run: Run, plan: ExecuteTools) -> Following | None:
        """For a turn with one server-side call: the next model call as it will be if the call's
        result stays as it is and nothing comes first (a stop, a pause, a steering message, a
        limit), so that its hooks can be asked ahead, with the call's after-tool hooks."""
        if len(plan.calls) != 1:
            return None

        def following(result: pb.FunctionCallOutput) -> tuple[int, TurnRequest] | None:
            if run.reason or run.steer or run.pause_reason is not None:
                return None
            if run.governor.limit_reached(run.turn, run.response) is not None:
                return None
            items = []
            for output in _in_model_order(run, [result, *plan.rejected]):
                # Made as `_add_outputs` will make it, under the id it will have.
                item_id = run.output_ids.setdefault(output.call_id, new_item_id("function_call_output"))
                items.append(
                    pb.Item(id=item_id, status=pb.ItemStatus.ITEM_STATUS_COMPLETED, function_call_output=output)
                )
            turn = run.turn + 1
            return turn, self._turn_request(run, turn, run.context + items)

        return following

    def _add_outputs(self, run: Run, outputs: Sequence[pb.FunctionCallOutput]) -> list[pb.StreamEvent]:
        emitter = run.emitter
        events: list[pb.StreamEvent] = []
        emitter.start_turn()
        for output in outputs:
            item_id = run.output_ids.pop(output.call_id, "")
            events += emitter.add_item(pb.Item(id=item_id, function_call_output=output))
        run.context += emitter.turn_items
        return events

    # -- the end ----------------------------------------------------------------------------------

    def _finish(self, run: Run) -> None:
        """Apply the outcome to the response."""
        response = run.response
        match run.outcome:
            case Completed():
                new_status = COMPLETED
            case RequiresAction():
                new_status = REQUIRES_ACTION
            case Incomplete(reason=reason):
                new_status = INCOMPLETE
                response.incomplete_details.reason = reason
            case Failed(code=code, message=message):
                new_status = FAILED
                response.error.code = code
                response.error.message = message
            case Cancelled():
                new_status = CANCELLED
        response.status = state.transition(response.status, new_status)  # type: ignore[assignment]
        response.completed_at.FromNanoseconds(time.time_ns())

    async def _save(self, run: Run, *, required: bool = False) -> None:
        """Store the response as it is. `required` (the first save): a store that fails refuses
        the response, rather than run one that could never be read back or continued."""
        if not run.governor.written and run.response.status in state.TERMINAL:
            run.governor.write(run.response)
        if not run.response.store:
            return
        try:
            await self.store.save(StoredResponse(run.response, run.input_items, run.owner))
        except Exception as err:
            log.exception("response %s: saving failed", run.response_id)
            if required:
                raise RequestError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the response store is unavailable ({type(err).__name__}); nothing was started",
                    reason="store_unavailable",
                ) from err


def _in_model_order(run: Run, outputs: Sequence[pb.FunctionCallOutput]) -> list[pb.FunctionCallOutput]:
    """The order of the calls in the response's output (outputs of no call there last)."""
    by_call = {o.call_id: o for o in outputs}
    ordered = [
        by_call.pop(i.function_call.call_id)
        for i in run.response.output
        if i.WhichOneof("kind") == "function_call" and i.function_call.call_id in by_call
    ]
    return ordered + list(by_call.values())


def _handed_out(outcome: FinalOutcome) -> tuple[list[pb.FunctionCall], list[pb.ApprovalRequest]]:
    """What the terminal event hands to the client: calls to execute, approvals to decide."""
    if isinstance(outcome, RequiresAction):
        return list(outcome.calls), list(outcome.approvals)
    return [], []


def _steered(run: Run) -> bool:
    """Whether a cancellation of the driving task was a steering message's (and is absorbed).
    Not when a stop came too, or the task was cancelled for another reason as well (the client
    went away): that cancellation goes on."""
    if run.reason or not run.interrupting:
        return False
    run.interrupting = False
    task = asyncio.current_task()
    return task is None or task.uncancel() == 0


def _approval_request(call: pb.FunctionCall, tool: pb.Tool) -> pb.ApprovalRequest:
    label = tool.mcp.server_label if tool.WhichOneof("kind") == "mcp" else ""
    return pb.ApprovalRequest(call_id=call.call_id, name=call.name, arguments=call.arguments, server_label=label)


async def _given(completion: Completion) -> Completion:
    return completion


async def _next_delta(stream: AsyncIterator[ProviderEvent]) -> ProviderEvent:
    """The first delta, awaited in a task of its own (a task needs a coroutine)."""
    try:
        return await anext(stream)
    except StopAsyncIteration:
        raise ProviderError("backend_protocol_error", "the model stream ended without a finish") from None


async def _close(stream: AsyncIterator[ProviderEvent]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await asyncio.shield(aclose())


def _stop_outcome(run: Run) -> FinalOutcome:
    if run.reason == "max_duration":
        return Incomplete("max_duration")
    if run.reason == "deadline":
        return Failed("deadline_exceeded", "the request's deadline passed before the response finished")
    return Cancelled()


def _add_usage(response: pb.Response, usage: pb.Usage | None) -> None:
    if usage is None:
        return
    total = response.usage
    total.input_tokens += usage.input_tokens
    total.output_tokens += usage.output_tokens
    total.total_tokens += usage.total_tokens or (usage.input_tokens + usage.output_tokens)


def _check_choice_names(choice: pb.ToolChoice | None, tools: ToolSet) -> None:
    """A forced function or allowed_tools entry must name a tool the request offers."""
    if choice is None:
        return
    violations: list[FieldViolation] = []
    which = choice.WhichOneof("choice")
    if which == "function" and choice.function.name not in tools.routes:
        violations.append(
            FieldViolation("tool_choice.function.name", f"{choice.function.name!r} is not one of the request's tools")
        )
    elif which == "allowed_tools":
        for n, name in enumerate(choice.allowed_tools.tool_names):
            if name not in tools.routes:
                violations.append(
                    FieldViolation(
                        f"tool_choice.allowed_tools.tool_names[{n}]",
                        f"{name!r} is not one of the request's tools",
                    )
                )
    if violations:
        raise RequestError(grpc.StatusCode.INVALID_ARGUMENT, violations[0].description, violations, "invalid_request")
