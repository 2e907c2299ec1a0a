"""The agentic loop: inference, tool calls, execution, results fed back, again.

`Engine.run` is the one code path for both modes: it yields every event of a response; the
non-streaming RPC drains it and sends only the terminal event. Each turn ends in a typed outcome
(see outcomes.py) chosen by the pure `plan_turn`; the loop matches on it.

The two places where interactive control (hooks, approvals, injected messages, pause/resume)
belongs are marked: the turn boundary at the top of `_turns`, and `_execute` before calls start.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import grpc

from antwort_grpc import pb
from antwort_grpc.engine import policy, state
from antwort_grpc.engine.emitter import ResponseEmitter
from antwort_grpc.engine.history import load_history, unanswered_calls
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
from antwort_grpc.engine.runs import RunHandle, RunRegistry
from antwort_grpc.engine.tools import ToolSet, resolve_tools
from antwort_grpc.errors import FieldViolation, RequestError, invalid_argument
from antwort_grpc.executors.base import ToolExecutor, current_deadline
from antwort_grpc.providers.base import (
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
from antwort_grpc.storage.base import ResponseStore, StoredResponse

log = logging.getLogger(__name__)

S = pb.ResponseStatus


@dataclass(slots=True)
class EngineConfig:
    # No executors: single-shot (tool calls are returned as they are, status completed).
    executors: Sequence[ToolExecutor] = ()
    max_turns: int = 10
    default_model: str = ""
    history_max_depth: int = 100


class _Stopped(Exception):
    """A cancel or deadline noticed at a check point (not during an interruptible wait)."""


@dataclass(slots=True)
class _Run:
    request: pb.CreateResponseRequest
    response: pb.Response
    input_items: list[pb.Item]
    context: list[pb.Item]
    tools: ToolSet
    owner: str
    # Server-side calls an earlier response paused on without running (a mixed turn).
    pending: list[pb.Item] = field(default_factory=list)
    outcome: FinalOutcome = field(default_factory=Completed)
    # The first turn's model stream, started before `created` is written (see `Engine.run`).
    early: _EarlyStream | None = None


class _EarlyStream:
    """A model stream whose first delta is already being awaited in a task of its own, so the
    backend's round trip overlaps the writes of `created` and `in_progress`."""

    __slots__ = ("first", "stream")

    def __init__(self, stream: AsyncIterator[ProviderEvent]) -> None:
        self.stream = stream
        self.first: asyncio.Task[ProviderEvent] = asyncio.create_task(_next_delta(stream))

    async def discard(self) -> None:
        """Abandon it unused (the run stopped or failed before its first turn read it)."""
        self.first.cancel()
        await asyncio.gather(self.first, return_exceptions=True)
        await _close(self.stream)


class Engine:
    def __init__(self, provider: Provider, store: ResponseStore, config: EngineConfig | None = None) -> None:
        self.provider = provider
        self.store = store
        self.config = config or EngineConfig()
        self.runs = RunRegistry()

    # -- the public entry point ---------------------------------------------------------------

    async def run(
        self, request: pb.CreateResponseRequest, *, owner: str = "", timeout: float | None = None
    ) -> AsyncIterator[pb.StreamEvent]:
        """Every event of one response. Raises RequestError before the first event only; after it,
        every failure ends the stream in-band with a terminal event."""
        run = await self._prepare(request, owner)
        emitter = ResponseEmitter(run.response)
        handle = self.runs.start(run.response, run.owner)
        if timeout is not None:
            loop = asyncio.get_running_loop()
            # Stop a little early so the failed event still reaches the client in time.
            handle.set_deadline(loop.time() + timeout - min(0.5, timeout * 0.1))
            current_deadline.set(loop.time() + timeout)
        finished = False
        try:
            # Stored before the client learns the id: from then on any replica can read or cancel
            # it, and a crash leaves it to be found and marked interrupted.
            try:
                await self._save(run, required=True)
            except RequestError:
                finished = True  # nothing was stored and nobody heard of it: nothing to record
                raise
            if request.stream and not run.pending and self.config.max_turns > 0:
                # The model is asked now, after the save: its round trip then overlaps the
                # writes of the two events below instead of following them.
                stream = aiter(self.provider.stream(self._turn_request(run, 1)))
                run.early = _EarlyStream(stream)
            yield emitter.created()
            yield emitter.in_progress()
            try:
                async for event in self._turns(run, emitter, handle):
                    yield event
            except asyncio.CancelledError:
                if not handle.stop_requested:
                    raise
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
                run.outcome = _stop_outcome(handle)
            except _Stopped:
                run.outcome = _stop_outcome(handle)
            except ProviderError as err:
                log.warning("response %s: provider error %s: %s", run.response.id, err.code, err.message)
                run.outcome = Failed(err.code, err.message)
            except Exception as err:
                log.exception("response %s failed", run.response.id)
                run.outcome = Failed("internal_error", f"{type(err).__name__}: {err}")
            for event in emitter.close_turn(pb.ItemStatus.ITEM_STATUS_INCOMPLETE):
                yield event
            tool_calls = self._finish(run)
            await asyncio.shield(self._save(run))
            finished = True
            yield emitter.terminal(tool_calls)
        finally:
            try:
                # A model stream started early that no turn read (the run stopped or failed first).
                if run.early is not None:
                    early, run.early = run.early, None
                    await asyncio.shield(early.discard())
                if not finished:
                    # The client went away (or the server is shutting down): keep what was done.
                    if run.response.status not in state.TERMINAL:
                        emitter.close_turn(pb.ItemStatus.ITEM_STATUS_INCOMPLETE)
                        run.outcome = Cancelled()
                        self._finish(run)
                    await asyncio.shield(self._save(run))
            finally:
                self.runs.finish(handle)

    async def cancel(self, response_id: str) -> bool:
        """Stop a response running in this process; False if none is."""
        return self.runs.stop(response_id, "cancelled")

    # -- preparation (errors here become gRPC statuses) ---------------------------------------

    async def _prepare(self, request: pb.CreateResponseRequest, owner: str) -> _Run:
        model = request.model or self.config.default_model
        if not model:
            raise invalid_argument([FieldViolation("model", "required: no default model is configured")])
        history: list[pb.Item] = []
        if request.previous_response_id:
            history = await load_history(
                self.store, request.previous_response_id, owner=owner, max_depth=self.config.history_max_depth
            )
        items = input_items(request)
        tools = await resolve_tools(request.tools, self.config.executors)
        _check_choice_names(request.tool_choice if request.HasField("tool_choice") else None, tools)
        run = _Run(request, new_response(request, model), items, history + items, tools, owner)
        if self.config.executors and history:
            run.pending = [c for c in unanswered_calls(run.context) if c.function_call.name in tools.server_side]
        return run

    # -- the loop -----------------------------------------------------------------------------

    async def _turns(self, run: _Run, emitter: ResponseEmitter, handle: RunHandle) -> AsyncIterator[pb.StreamEvent]:
        request = run.request
        choice = request.tool_choice if request.HasField("tool_choice") else None
        loop_enabled = bool(self.config.executors)
        if run.pending:
            calls = [i.function_call for i in run.pending]
            async for event in self._execute(run, emitter, handle, ExecuteTools(calls)):
                yield event
            await self._save(run)
        turn = 0
        while True:
            # Turn boundary: the place for hooks before a model call, injected messages, pausing.
            if handle.stop_requested:
                raise _Stopped
            if turn >= self.config.max_turns:
                run.outcome = Incomplete("max_turns")
                return
            turn += 1
            emitter.start_turn()
            finish = FinishReason.STOP
            if request.stream:
                # The first turn's stream may already be under way (started in `run`).
                early, run.early = run.early, None
                if early is not None:
                    stream, first = early.stream, early.first
                else:
                    stream, first = aiter(self.provider.stream(self._turn_request(run, turn))), None
                async for step in self._stream_turn(stream, first, emitter, handle):
                    if isinstance(step, FinishReason):
                        finish = step
                    else:
                        yield step
            else:
                with handle.waiting():
                    completion = await self.provider.complete(self._turn_request(run, turn))
                _add_usage(run.response, completion.usage)
                finish = completion.finish
                for item in completion.items:
                    for event in emitter.add_item(item):
                        yield event
            produced = list(emitter.turn_items)
            run.context += produced
            calls = [i.function_call for i in produced if i.WhichOneof("kind") == "function_call"]
            outcome = policy.plan_turn(
                finish=finish,
                calls=calls,
                choice=choice,
                loop_enabled=loop_enabled,
                server_side=run.tools.server_side,
                known=run.tools.routes,
            )
            match outcome:
                case Completed() | Incomplete():
                    run.outcome = outcome
                    return
                case RequiresAction(rejected=rejected):
                    for event in self._add_outputs(run, emitter, rejected):
                        yield event
                    run.outcome = outcome
                    return
                case ExecuteTools():
                    async for event in self._execute(run, emitter, handle, outcome):
                        yield event
                    # Tool results can be expensive to redo: a crash from here on keeps them.
                    await self._save(run)

    def _turn_request(self, run: _Run, turn: int) -> TurnRequest:
        request = run.request
        choice = request.tool_choice if request.HasField("tool_choice") else None
        return TurnRequest(
            model=run.response.model,
            instructions=request.instructions,
            items=tuple(run.context),
            tools=run.tools.functions,
            tool_choice=policy.turn_tool_choice(choice, turn),
            parallel_tool_calls=run.response.parallel_tool_calls,
            max_output_tokens=request.max_output_tokens if request.HasField("max_output_tokens") else None,
            temperature=request.temperature if request.HasField("temperature") else None,
            top_p=request.top_p if request.HasField("top_p") else None,
        )

    async def _stream_turn(
        self,
        stream: AsyncIterator[ProviderEvent],
        first: asyncio.Task[ProviderEvent] | None,
        emitter: ResponseEmitter,
        handle: RunHandle,
    ) -> AsyncIterator[pb.StreamEvent | FinishReason]:
        try:
            while True:
                with handle.waiting():
                    if first is not None:
                        # Awaiting the task directly: a stop that cancels this task cancels it too.
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
                if handle.stop_requested:
                    raise _Stopped
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
                    status = (
                        pb.ItemStatus.ITEM_STATUS_INCOMPLETE
                        if delta.finish is FinishReason.LENGTH
                        else pb.ItemStatus.ITEM_STATUS_COMPLETED
                    )
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

    async def _execute(
        self, run: _Run, emitter: ResponseEmitter, handle: RunHandle, plan: ExecuteTools
    ) -> AsyncIterator[pb.StreamEvent]:
        """Run a turn's server-side calls concurrently; outputs go back in the model's order."""
        # Before the calls start: the place for approvals and before-tool hooks.
        items = {i.function_call.call_id: (i, n) for n, i in enumerate(run.response.output)}
        queue: asyncio.Queue[tuple[int, str | pb.FunctionCallOutput]] = asyncio.Queue()
        results: dict[int, pb.FunctionCallOutput] = {}
        tasks: list[asyncio.Task[None]] = []

        async def one(position: int, call: pb.FunctionCall) -> None:
            route = run.tools.routes[call.name]
            assert route.executor is not None
            try:
                result = await route.executor.execute(call, route.tool, lambda m: queue.put_nowait((position, m)))
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.warning("tool %s (%s) failed: %s", call.name, call.call_id, err)
                result = pb.FunctionCallOutput(output=f"tool {call.name!r} failed: {err}", is_error=True)
            result.call_id = call.call_id
            queue.put_nowait((position, result))

        for position, call in enumerate(plan.calls):
            if call.call_id in items:
                item, index = items[call.call_id]
                yield emitter.tool_started(item, index)
            tasks.append(asyncio.create_task(one(position, call)))
        try:
            while len(results) < len(tasks):
                with handle.waiting():
                    position, update = await queue.get()
                call = plan.calls[position]
                found = items.get(call.call_id)
                if isinstance(update, str):
                    if found:
                        yield emitter.tool_progress(found[0], found[1], update)
                    continue
                results[position] = update
                if found:
                    yield emitter.tool_finished(found[0], found[1], update)
                if handle.stop_requested:
                    raise _Stopped
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        outputs = [results[p] for p in range(len(plan.calls))]
        by_call = {o.call_id: o for o in outputs + list(plan.rejected)}
        # Model order: the order of the calls in the output, rejected ones included.
        ordered = [
            by_call.pop(c.function_call.call_id) for c in emitter.turn_items if c.function_call.call_id in by_call
        ]
        ordered += list(by_call.values())
        for event in self._add_outputs(run, emitter, ordered):
            yield event

    def _add_outputs(
        self, run: _Run, emitter: ResponseEmitter, outputs: Sequence[pb.FunctionCallOutput]
    ) -> list[pb.StreamEvent]:
        events: list[pb.StreamEvent] = []
        emitter.start_turn()
        for output in outputs:
            events += emitter.add_item(pb.Item(function_call_output=output))
        run.context += emitter.turn_items
        return events

    # -- the end --------------------------------------------------------------------------------

    def _finish(self, run: _Run) -> list[pb.FunctionCall]:
        """Apply the outcome to the response; the calls the client must answer, if any."""
        response = run.response
        outcome = run.outcome
        tool_calls: list[pb.FunctionCall] = []
        match outcome:
            case Completed():
                new_status = S.RESPONSE_STATUS_COMPLETED
            case RequiresAction(calls=calls):
                new_status = S.RESPONSE_STATUS_REQUIRES_ACTION
                tool_calls = list(calls)
            case Incomplete(reason=reason):
                new_status = S.RESPONSE_STATUS_INCOMPLETE
                response.incomplete_details.reason = reason
            case Failed(code=code, message=message):
                new_status = S.RESPONSE_STATUS_FAILED
                response.error.code = code
                response.error.message = message
            case Cancelled():
                new_status = S.RESPONSE_STATUS_CANCELLED
        response.status = state.transition(response.status, new_status)  # type: ignore[assignment]
        response.completed_at.FromNanoseconds(time.time_ns())
        return tool_calls

    async def _save(self, run: _Run, *, required: bool = False) -> None:
        """Store the response as it is. `required` (the first save): a store that fails refuses
        the response, rather than run one that could never be read back or continued."""
        if not run.response.store:
            return
        try:
            await self.store.save(StoredResponse(run.response, run.input_items, run.owner))
        except Exception as err:
            log.exception("response %s: saving failed", run.response.id)
            if required:
                raise RequestError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the response store is unavailable ({type(err).__name__}); nothing was started",
                    reason="store_unavailable",
                ) from err


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


def _stop_outcome(handle: RunHandle) -> FinalOutcome:
    if handle.reason == "deadline":
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
