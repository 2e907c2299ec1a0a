"""The agentic loop: inference, tool calls, execution, results fed back, again.

`Engine.start` prepares a response and returns its `Run`; `run.events()` is the one code path for
both modes (the non-streaming RPC drains it and sends only the terminal event). Each turn ends in a
typed outcome (outcomes.py) chosen by pure policies; the loop matches on it.

Controls act at the check points: `checkpoint` at every turn boundary (stop, pause, steering
messages; checkpoints.py), `gate` before tool calls start (pause, approvals; tool_turn.py), and the
model stream itself for a steer (cut at once; model_call.py). `_call_model` is the one place the
model is called.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import grpc

from antwort_grpc import pb
from antwort_grpc.engine import continuation, policy, state
from antwort_grpc.engine.checkpoints import checkpoint, inject_items
from antwort_grpc.engine.governor import Governor
from antwort_grpc.engine.history import HISTORY_MAX_BYTES, History, load_history
from antwort_grpc.engine.budget import ServerLimits
from antwort_grpc.engine.model_call import ModelCall, add_usage, await_completion, given, stream_turn, turn_request
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
from antwort_grpc.engine.run import Run, Stopped
from antwort_grpc.engine.registry import RunRegistry
from antwort_grpc.engine.tool_turn import add_outputs, execute, gate, supersede
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
    TurnRequest,
)
from antwort_grpc.storage.base import ResponseStore, StoredResponse

log = logging.getLogger(__name__)

S = pb.ResponseStatus
# Enum values as plain ints: a protobuf enum attribute lookup is a Python-level call, and these are
# read on every response.
RESPOND: int = pb.TurnDecision.TURN_DECISION_RESPOND
CALL_TOOLS: int = pb.TurnDecision.TURN_DECISION_CALL_TOOLS
INTERRUPTED: int = pb.TurnDecision.TURN_DECISION_INTERRUPTED
FOLLOW_UP: int = pb.InputKind.INPUT_KIND_FOLLOW_UP
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
        return turn_request(run, 1)

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
                first = run.governor.early(turn_request(run, 1))
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
            except Stopped:
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
            async for event in execute(run, ExecuteTools(resumed.calls, resumed.outputs)):
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
            async for event in checkpoint(run):
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
                async for step in stream_turn(run, call):
                    if step is None or isinstance(step, FinishReason):
                        finish = step
                    else:
                        yield step
            else:
                finish = None
                completion = await await_completion(run, call)
                if completion is not None:
                    add_usage(run.response, completion.usage)
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
                for event in supersede(run, calls):
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
                    for event in inject_items(run, FOLLOW_UP, run.follow_ups.pop(0)):
                        yield event
                continue
            if isinstance(screened, Completed | Incomplete):
                yield emitter.turn_completed(turn, clock.time() - began)
                run.outcome = screened
                return
            if run.governor.tool_calls_exceed(screened.accepted, run.tools.server_side):
                for event in add_outputs(run, screened.rejected):
                    yield event
                yield emitter.turn_completed(turn, clock.time() - began)
                run.outcome = Incomplete("max_tool_calls")
                return
            # Before the calls start: pause, then approvals.
            async for event in checkpoint(run, inject=False):
                yield event
            outcome: RequiresAction | ExecuteTools | None = None
            async for gated in gate(run, screened, self.config.approval_timeout):
                if isinstance(gated, RequiresAction | ExecuteTools):
                    outcome = gated
                else:
                    yield gated
            assert outcome is not None
            if isinstance(outcome, RequiresAction):
                for event in add_outputs(run, outcome.rejected):
                    yield event
                yield emitter.turn_completed(turn, clock.time() - began)
                run.outcome = outcome
                return
            async for event in execute(run, outcome):
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
        request = request or turn_request(run, turn)
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
            decided = await run.governor.before_model(turn, turn_request(run, turn), pause)
            for event in run.governor.hook_events(run.emitter):
                yield event
            if not isinstance(decided, Paused):
                break
            run.pause_reason, pause = decided.reason, False
            async for event in checkpoint(run):
                yield event
        if isinstance(decided, Completion):
            run.governor.model_started(run.response.usage)
            call = ModelCall(completion=given(decided))
            call.answered = True
            yield call
            return
        yield self._call_model(run, turn, decided)

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


def _handed_out(outcome: FinalOutcome) -> tuple[list[pb.FunctionCall], list[pb.ApprovalRequest]]:
    """What the terminal event hands to the client: calls to execute, approvals to decide."""
    if isinstance(outcome, RequiresAction):
        return list(outcome.calls), list(outcome.approvals)
    return [], []


def _stop_outcome(run: Run) -> FinalOutcome:
    if run.reason == "max_duration":
        return Incomplete("max_duration")
    if run.reason == "deadline":
        return Failed("deadline_exceeded", "the request's deadline passed before the response finished")
    return Cancelled()


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
