"""The agentic loop: inference, tool calls, execution, results fed back, again.

`Engine.start` prepares a response and returns its `Run`; `run.events()` is the one code path for
both modes (the non-streaming RPC drains it and sends only the terminal event). Each turn ends in
one typed outcome (turn.py) and the loop is one `match` over them; the run ends through
`Run.finish`, whatever happened, and is stored with its final status.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field

import grpc

from antwort_grpc import pb
from antwort_grpc.engine import continuation, durable, response_status
from antwort_grpc.engine.budget import ControlLimits, ServerLimits, run_limits
from antwort_grpc.engine.checkpoints import inject_items
from antwort_grpc.engine.conversation import conversation_append
from antwort_grpc.engine.durable import Resumed
from antwort_grpc.engine.emitter import ResponseEmitter, echoed_tools
from antwort_grpc.engine.gated_tools import GatedTools
from antwort_grpc.engine.history import HISTORY_MAX_BYTES, History, load_conversation, load_history
from antwort_grpc.engine.hook_gate import HookPoints, gate
from antwort_grpc.engine.model_call import call_model, structured_format, turn_request
from antwort_grpc.engine.outcomes import (
    Cancelled,
    Failed,
    FinalOutcome,
    NextRound,
    RequiresAction,
    RunAgain,
)
from antwort_grpc.engine.output_format import checked
from antwort_grpc.engine.registry import RunRegistry
from antwort_grpc.engine.request import input_items, new_response
from antwort_grpc.engine.run import Continuation, Run, RunSetup, Stopped
from antwort_grpc.engine.step import Step
from antwort_grpc.engine.tools import ToolSet, resolve_tools
from antwort_grpc.engine.turn import Turn, TurnSettings
from antwort_grpc.engine.turn_rules import Screened
from antwort_grpc.engine.window import UNLIMITED, ContextWindow
from antwort_grpc.errors import FieldViolation, RequestError, invalid_argument
from antwort_grpc.executors.base import ToolExecutor, current_deadline
from antwort_grpc.hooks.dispatch import Dispatcher, HookFailed, HookRejected, HookRun, Problems
from antwort_grpc.hooks.service import Point
from antwort_grpc.offload import off_loop
from antwort_grpc.providers.base import Provider, ProviderError, TurnRequest
from antwort_grpc.storage.base import ResponseStore, StoredResponse

log = logging.getLogger(__name__)

FOLLOW_UP: int = pb.InputKind.INPUT_KIND_FOLLOW_UP
ITEM_INCOMPLETE: int = pb.ItemStatus.ITEM_STATUS_INCOMPLETE
AUTO: int = pb.Truncation.TRUNCATION_AUTO


@dataclass(slots=True)
class EngineConfig:
    # No executors: single-shot (tool calls are returned as they are, status completed).
    executors: Sequence[ToolExecutor] = ()
    default_model: str = ""
    history_max_depth: int = 100
    # The most bytes of input and output a previous_response_id chain may hold.
    history_max_bytes: int = HISTORY_MAX_BYTES
    # How long a call waits for an approve/deny decision before it is denied with reason "timeout".
    approval_timeout: float = 300.0
    # The server's maximums of execution limits (max_turns among them) and the context window.
    limits: ServerLimits = field(default_factory=ServerLimits)
    # Policy hooks; None: none are configured, and none are ever asked.
    hooks: Dispatcher | None = None
    # What controls may add to a response (the response's bytes in all: history_max_bytes).
    controls: ControlLimits = field(default_factory=ControlLimits)

    @property
    def max_turns(self) -> int:
        return self.limits.max_turns


class Engine:
    def __init__(self, provider: Provider, store: ResponseStore, config: EngineConfig | None = None) -> None:
        self.provider = provider
        self.store = store
        self.config = config or EngineConfig()
        self.runs = RunRegistry()
        # A response must stay readable and continuable: what controls add counts against the
        # history cap.
        self.controls = dataclasses.replace(self.config.controls, max_response_bytes=self.config.history_max_bytes)
        self.settings = TurnSettings(
            provider,
            bool(self.config.executors),
            self.config.approval_timeout,
            self._save,
            coalescing=bool(getattr(provider, "coalesces", False)),
        )

    @property
    def server_limits(self) -> ServerLimits:
        return self.config.limits

    # -- the public entry points ----------------------------------------------------------------

    async def _history(self, request: pb.CreateResponseRequest, owner: str) -> History:
        """The conversation `previous_response_id` (or `conversation_id`) names (empty without one)."""
        if request.conversation_id:
            return await load_conversation(
                self.store, request.conversation_id, owner=owner, max_bytes=self.config.history_max_bytes
            )
        if not request.previous_response_id:
            return History()
        return await load_history(
            self.store,
            request.previous_response_id,
            owner=owner,
            max_depth=self.config.history_max_depth,
            max_bytes=self.config.history_max_bytes,
        )

    async def start(
        self,
        request: pb.CreateResponseRequest,
        *,
        owner: str = "",
        timeout: float | None = None,
        controller: bool = False,
        hook_run: HookRun | None = None,
        problems: Problems = lambda _: [],
        response_id: str = "",
    ) -> Run:
        """Prepare and store a new response; iterate `run.events()` to run it. Raises RequestError
        (and nothing is stored) when it cannot start. The request is expected to have passed
        `responses.validation` (the responses layer does that for every front door; `problems`
        is that validation, for a request a before-response hook returns).

        `controller`: a client stays attached that can decide approvals while the run waits.
        `response_id`: the id to give it (an idempotency key was bound to it); else a new one."""
        run = await self._admit(request, owner, controller, hook_run, problems, response_id)
        # Stored before the client learns the id: from then on any replica can read or cancel
        # it, and a crash leaves it to be found and marked interrupted.
        await self._save(run, required=True)
        self.runs.add(run)
        if timeout is not None:
            run.time_limit(timeout)
        if run.limits.max_duration is not None:
            run.stop_at(asyncio.get_running_loop().time() + run.limits.max_duration, "max_duration")
        run.bind(self._drive)
        return run

    async def resume(self, request: pb.CreateResponseRequest, record: StoredResponse, resumed: Resumed) -> Run:
        """A background run another replica began, resumed here from its checkpoint (durable.py):
        no hooks are asked again and no deadline applies (the caller is gone); max_duration runs
        from the response's start."""
        owner, response = record.owner, resumed.response
        history = await self._history(request, owner)
        tools = await resolve_tools(request.tools, self.config.executors)
        limits = self.config.limits
        seen = list(response.output)
        # A checkpoint taken before a turn's calls run shows them without outputs: that turn
        # was open (and decided).
        open_turn = resumed.turn if resumed.turn and durable.unanswered(seen) else 0
        began = Continuation()
        if resumed.turn == 0 and self.config.executors:
            # Lost before its first turn: what it started with (an earlier response's calls) may
            # be left to run.
            choice = request.tool_choice if request.HasField("tool_choice") else None
            began, _ = continuation.resolve(history.items, history.model_calls, record.input_items, tools, choice)
        superseded = durable.superseded_items(resumed.tail, len(seen), open_turn)
        for index in sorted(superseded.items):
            response.output.append(superseded.items[index])
        setup = RunSetup(
            input_items=record.input_items,
            context=history.items + record.input_items + seen,
            tools=tools,
            owner=owner,
            limits=run_limits(request, limits),
            window=ContextWindow(limits.context if request.truncation == AUTO else UNLIMITED),
            continuation=durable.resumed_continuation(resumed, began, tools),
            controls=self.controls,
        )
        run = Run(request, response, setup)
        emitter = run.emitter
        recovery = None
        if resumed.last_sequence_number:
            # Lost before its first event was logged: it starts as any response does.
            recovery = durable.recovery(emitter, resumed, superseded)
        run.restore(resumed.turn + superseded.turns, resumed.round, recovery)
        self.runs.add(run)
        if run.limits.max_duration is not None:
            started = response.created_at.ToNanoseconds() / 1e9
            clock = asyncio.get_running_loop()
            run.stop_at(clock.time() + max(0.0, started + run.limits.max_duration - time.time()), "max_duration")
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
        problems: Problems,
        response_id: str = "",
    ) -> Run:
        """The response prepared and past the before-response hooks, which may refuse the request
        (PERMISSION_DENIED; UNAVAILABLE when a fail-closed hook failed) or change it (prepared
        again, under the same id). A request that cannot be prepared still goes to the hooks
        first: one may make it one that can."""
        hooks = gate(self.config.hooks, hook_run)
        if not hooks.wants(Point.HOOK_POINT_BEFORE_RESPONSE):
            return await self._prepare(request, owner, controller, hooks, response_id)
        run: Run | None = None
        with contextlib.suppress(RequestError):
            run = await self._prepare(request, owner, controller, hooks, response_id)
        try:
            if run is None:
                admitted = await hooks.admit(request, problems, None)
            else:
                admitted = await run.hooks.admit(request, problems, self._first_call(run))
        except HookRejected as rejected:
            raise RequestError(grpc.StatusCode.PERMISSION_DENIED, str(rejected), reason="hook_rejected") from None
        except HookFailed as failed:
            raise RequestError(grpc.StatusCode.UNAVAILABLE, str(failed), reason="hook_failed") from None
        if run is not None and admitted is request:
            return run
        # Prepared again with a gate of its own: what was asked ahead was about the request before.
        again = gate(self.config.hooks, hook_run)
        return await self._prepare(admitted, owner, controller, again, run.response.id if run else response_id)

    def _first_call(self, run: Run) -> TurnRequest | None:
        """The first model call, when the response starts with one (not with calls to run) and
        hooks are asked before it."""
        if run.limits.max_turns <= 0 or run.continuation.starts_with_tools:
            return None
        if not run.hooks.asked_before_model:
            return None
        return turn_request(run, 1)

    async def _prepare(
        self,
        request: pb.CreateResponseRequest,
        owner: str,
        controller: bool,
        hooks: HookPoints,
        response_id: str = "",
    ) -> Run:
        model = request.model or self.config.default_model
        if not model:
            raise invalid_argument([FieldViolation("model", "required: no default model is configured")])
        history = await self._history(request, owner)
        if _large(request):
            # Copying its items and its tools into the Response: tens of milliseconds at the limits.
            items, ending, tools_echoed, response = await off_loop(_made, request, model)
        else:
            items, ending, tools_echoed, response = _made(request, model)
        tools = await resolve_tools(request.tools, self.config.executors)
        choice = request.tool_choice if request.HasField("tool_choice") else None
        _check_choice_names(choice, tools)
        resumed, violations = continuation.resolve(history.items, history.model_calls, items, tools, choice)
        if violations:
            raise invalid_argument(violations)
        if response_id:
            response.id = response_id
        if request.truncation:
            response.truncation = request.truncation
        limits = self.config.limits
        setup = RunSetup(
            input_items=items,
            context=history.items + items,
            tools=tools,
            owner=owner,
            limits=run_limits(request, limits),
            # Only truncation AUTO looks at the window.
            window=ContextWindow(limits.context if request.truncation == AUTO else UNLIMITED),
            hooks=hooks,
            controls=self.controls,
            # An engine without executors is single-shot: it runs nothing of an earlier response.
            continuation=resumed if self.config.executors else Continuation(),
            controller=controller,
            ending=ending,
            echoed_tools=tools_echoed,
        )
        return Run(request, response, setup)

    # -- one response ---------------------------------------------------------------------------

    async def _drive(self, run: Run) -> AsyncGenerator[pb.StreamEvent, None]:
        if run.deadline is not None:
            current_deadline.set(run.deadline)
        emitter = run.emitter
        finished = False
        try:
            if run.recovery is None:
                self._start_early(run)
                created, in_progress = await _opening(emitter)
                yield created
                yield in_progress
            else:
                for event in run.recovery:
                    yield event
            for event in run.hooks.events(emitter):
                yield event
            turns = _Turns(run, self.settings)
            outcome: FinalOutcome
            try:
                async for event in turns.events():
                    yield event
                outcome = turns.result
                if run.request.HasField("text"):
                    outcome = checked(structured_format(run.request), run.response.output, outcome)
            except Stopped:
                outcome = run.stop_outcome()
            except ProviderError as err:
                log.warning("response %s: provider error %s: %s", run.response_id, err.code, err.message)
                outcome = Failed(err.code, err.message)
            except HookFailed as err:
                outcome = Failed("hook_failed", str(err))
            except Exception as err:
                log.exception("response %s failed", run.response_id)
                outcome = Failed("internal_error", f"{type(err).__name__}: {err}")
            for event in emitter.close_turn(ITEM_INCOMPLETE):
                yield event
            outcome = await self._audited(run, outcome)
            run.finish(outcome)
            self._write_record(run)
            for event in run.hooks.events(emitter, ending=True):
                yield event
            await asyncio.shield(self._save_final(run))
            finished = True
            yield await _terminal(emitter, outcome)
        finally:
            await self._end(run, finished)

    def _start_early(self, run: Run) -> None:
        """The model is asked now, when the response starts with a model call: its round trip
        overlaps the writes of `created` and `in_progress`."""
        if not run.request.stream or run.limits.max_turns <= 0 or run.continuation.starts_with_tools:
            return
        first = run.hooks.early(turn_request(run, 1))
        if first is not None:
            run.start_early(call_model(run, self.provider, first))

    async def _end(self, run: Run, finished: bool) -> None:
        try:
            early = run.take_early()
            if early is not None:
                await asyncio.shield(early.discard())
            if not finished and not run.abandoned:
                # The client went away (or the server is shutting down): keep what was done.
                if not run.ended and run.response.status not in response_status.TERMINAL:
                    run.emitter.close_turn(ITEM_INCOMPLETE)
                    run.finish(Cancelled())
                    self._write_record(run)
                await asyncio.shield(self._save(run))
        finally:
            self.runs.finish(run)

    async def _audited(self, run: Run, outcome: FinalOutcome) -> FinalOutcome:
        """Audit hooks see the response as it ends (its final status and metrics) and every
        observation is delivered; a fail-closed failure there is the response's end instead."""
        ending = run.response
        if run.hooks.wants(Point.HOOK_POINT_AFTER_RESPONSE):
            ending = pb.Response()
            ending.CopyFrom(run.response)
            response_status.end(ending, outcome)
            self._write_record(run, ending)
        try:
            failed = await run.hooks.after_response(ending)
        except Exception as err:  # whatever happens here, the response still ends and is stored
            log.exception("response %s: the audit hooks failed", run.response_id)
            return Failed("internal_error", f"{type(err).__name__}: {err}")
        return outcome if failed is None else failed

    def _write_record(self, run: Run, response: pb.Response | None = None) -> None:
        """The run's metrics and how much the model did not see, into the response."""
        response = response or run.response
        run.record.write(response.metrics, run.hooks.totals())
        response.omitted_items = run.window.omitted

    async def _save_final(self, run: Run) -> None:
        """The save of the ended response. One in a kept conversation is appended to it in the
        same write (or, where the store cannot, just before): whoever sees the response ended
        sees it in the conversation."""
        if run.request.conversation_id and run.joins_conversation and await conversation_append(self.store, run):
            return
        await self._save(run)

    async def _save(self, run: Run, *, required: bool = False) -> None:
        """Store the response as it is. `required` (the first save): a store that fails refuses
        the response, rather than run one that could never be read back or continued."""
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


class _Turns(Step[FinalOutcome]):
    """A response's turns, until one ends it (after what a continuation starts with)."""

    def __init__(self, run: Run, settings: TurnSettings) -> None:
        super().__init__()
        self.run = run
        self.settings = settings

    async def events(self) -> AsyncIterator[pb.StreamEvent]:
        run = self.run
        if run.continuation.starts_with_tools:
            async for event in self._resume():
                yield event
        while not self.ended:
            turn = Turn(run, self.settings)
            async for event in turn.events():
                yield event
            match turn.result:
                case RunAgain():
                    continue
                case NextRound():
                    run.next_round()
                    for event in inject_items(run, FOLLOW_UP, run.take_follow_up()):
                        yield event
                case outcome:
                    self.end(outcome)

    async def _resume(self) -> AsyncIterator[pb.StreamEvent]:
        """A continuation first runs what the earlier response left open: its server-side calls
        (through the same gates as any call) and its denials; approved client calls are handed
        out."""
        run = self.run
        resumed = run.continuation
        screened = Screened(resumed.calls, resumed.outputs)
        settings = self.settings
        tools = GatedTools(
            run, screened, settings.approval_timeout, settings.save, resumed.approved, gate=bool(resumed.calls)
        )
        async for event in tools.events():
            yield event
        match tools.result:
            case RequiresAction(calls=calls, approvals=approvals):
                for event in _hand_out(run, resumed.handoff):
                    yield event
                self.end(RequiresAction([*resumed.handoff, *calls], [], approvals))
            case Failed() as failed:
                self.end(failed)
            case None if resumed.handoff:
                for event in _hand_out(run, resumed.handoff):
                    yield event
                self.end(RequiresAction(resumed.handoff))


def _hand_out(run: Run, calls: Sequence[pb.FunctionCall]) -> list[pb.StreamEvent]:
    """Client calls approved just now, last in this response's output as the calls to run (as a
    response that pauses for its calls ends, and as OpenAI's API answers): the output alone tells
    a client what to do, over either door. The same call ids as the calls the model made."""
    events: list[pb.StreamEvent] = []
    for call in calls:
        events += run.emitter.add_item(pb.Item(function_call=call))
    return events


# A request with more tools or items than this has its pieces made in the worker thread.
_LARGE_TOOLS = 8
_LARGE_ITEMS = 256


def _large(request: pb.CreateResponseRequest) -> bool:
    if len(request.tools) > _LARGE_TOOLS:
        return True
    return request.WhichOneof("input") == "input_items" and len(request.input_items.items) > _LARGE_ITEMS


def _made(request: pb.CreateResponseRequest, model: str) -> tuple[list[pb.Item], pb.StreamEvent, bytes, pb.Response]:
    """The request's input items, and the Response it starts inside the event that will end it
    (with its tools echoed as bytes)."""
    items = input_items(request)
    ending = pb.StreamEvent()
    tools_echoed = echoed_tools(request.tools) if request.tools else b""
    return items, ending, tools_echoed, new_response(request, model, within=ending, tools=tools_echoed)


# A Response echoing large tools has its lifecycle events made in the worker thread: each parse
# holds the GIL as long there, but the event loop runs between it and other requests' heavy steps
# (on the loop, four such openings ran back to back while health checks and every other stream
# waited).


async def _opening(emitter: ResponseEmitter) -> tuple[pb.StreamEvent, pb.StreamEvent]:
    return await off_loop(emitter.opening) if emitter.heavy() else emitter.opening()


async def _terminal(emitter: ResponseEmitter, outcome: FinalOutcome) -> pb.StreamEvent:
    calls, approvals = _handed_out(outcome)
    if emitter.heavy():
        return await off_loop(emitter.terminal, calls, approvals)
    return emitter.terminal(calls, approvals)


def _handed_out(outcome: FinalOutcome) -> tuple[list[pb.FunctionCall], list[pb.ApprovalRequest]]:
    """What the terminal event hands to the client: calls to execute, approvals to decide."""
    if isinstance(outcome, RequiresAction):
        return list(outcome.calls), list(outcome.approvals)
    return [], []


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
