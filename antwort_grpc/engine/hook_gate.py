"""The hook gate of one run: where the loop asks the configured hooks, and the answers asked ahead.

Every run has a gate, and the loop asks it at every hook point without asking first whether hooks
are configured. `HookPoints` is the gate of a run without hooks: each point a no-op, answered at
once, and no hook request is ever built (`NO_HOOKS`, one for every such run). `HookGate` asks the
configured hooks: it turns the loop's questions into hook points (hooks/dispatch.py does the
calling) and keeps what was asked ahead: the first model call's hooks with the before-response
hooks, the next model call's with a turn's one after-tool call, the before-tool decisions with the
approvals. An answer asked ahead is used only for the very call it was asked about.

A hook call the run waits for in its own task (at a turn boundary, before tools start) races the
run's inbox (`Run.wait_for`): a stop that comes meanwhile cancels the call and ends the run at
once. The before- and after-tool calls run inside the tool calls' tasks, which the tool round
races; the before-response call comes before anyone can stop the run; the after-response audit
comes once the run has its end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from antwort_grpc import pb
from antwort_grpc.engine.outcomes import Failed
from antwort_grpc.engine.turn_rules import needs_approval
from antwort_grpc.hooks.dispatch import (
    Dispatcher,
    HookFailed,
    HookFailure,
    HookRun,
    ModelDecision,
    Paused,
    Problems,
    ToolDecision,
)
from antwort_grpc.hooks.service import Point
from antwort_grpc.providers.base import Completion, TurnRequest

if TYPE_CHECKING:
    from antwort_grpc.engine.emitter import ResponseEmitter
    from antwort_grpc.engine.tools import Route

P = Point
# The next model call (its turn and request) as it will be with a given tool result, or None
# when it is not certain there will be one.
Following = Callable[[pb.FunctionCallOutput], "tuple[int, TurnRequest] | None"]
# How the run waits for a hook call: raced against its inbox (Run.wait_for).
Race = Callable[[Awaitable[Any]], Awaitable[Any]]


@dataclasses.dataclass(frozen=True, slots=True)
class Gated:
    """Before a turn's calls start: the calls still in play, the outputs of those the hooks
    denied, and the ids of those they approved (no client decision needed)."""

    calls: list[pb.FunctionCall]
    denied: list[pb.FunctionCallOutput]
    approved: set[str]


class HookPoints:
    """The gate of a run without hooks: every point answered at once with "no objection"."""

    def bind(self, response: pb.Response, race: Race) -> None:
        """The response this run builds, and how the run waits for a hook call."""

    def wants(self, point: int) -> bool:
        return False

    @property
    def pauses(self) -> bool:
        return False

    @property
    def asked_before_model(self) -> bool:
        """Whether hooks are asked before a model call (a pause check or before-model hooks)."""
        return False

    @property
    def asks_ahead(self) -> bool:
        """Whether a turn's one after-tool call may carry the next model call's hooks."""
        return False

    def events(self, emitter: ResponseEmitter, *, ending: bool = False) -> list[pb.StreamEvent]:
        """`hook_failed` events for the fail-open failures since the last call."""
        return []

    def flush(self) -> None:
        """The run is about to wait (on the model, tools, a client)."""

    def totals(self) -> tuple[int, int, float]:
        """Hook calls, failures, seconds."""
        return 0, 0, 0.0

    def item_id(self, call_id: str, make: Callable[[], str] | None = None) -> str:
        """The id of the output item of `call_id` made ahead ("" when none was); `make` makes one."""
        return make() if make is not None else ""

    async def admit(
        self, request: pb.CreateResponseRequest, problems: Problems, first: TurnRequest | None
    ) -> pb.CreateResponseRequest:
        """The before-response hooks: the request to run."""
        return request

    def early(self, request: TurnRequest) -> TurnRequest | None:
        """The first model call, if it may start before anything else."""
        return request

    async def before_model(self, turn: int, request: TurnRequest, pause: bool) -> Paused | TurnRequest | Completion:
        return request

    def after_model(self, turn: int, output: Sequence[pb.Item], spent: tuple[int, int, int]) -> None:
        """Observed by hooks (held for their next exchange)."""

    async def after_response(self, response: pb.Response) -> Failed | None:
        """Audit hooks see the response as it ends; a fail-closed failure is its end instead."""
        return None

    async def before_tools(
        self, calls: list[pb.FunctionCall], routes: Mapping[str, Route], pause: bool
    ) -> Paused | Gated:
        return Gated(calls, [], set())

    async def before_tool(self, call: pb.FunctionCall, tool: pb.Tool) -> ToolDecision | None:
        return None

    async def after_tool(
        self, call: pb.FunctionCall, result: pb.FunctionCallOutput, following: Following | None
    ) -> pb.FunctionCallOutput:
        return result


# The gate of every run without hooks (it keeps nothing).
NO_HOOKS = HookPoints()


def gate(dispatcher: Dispatcher | None, hook_run: HookRun | None) -> HookPoints:
    """A run's gate: the configured hooks', or the no-op one when none are configured (or the
    run has no hook side)."""
    if dispatcher is None or hook_run is None:
        return NO_HOOKS
    return HookGate(dispatcher, hook_run)


async def _unraced(work: Awaitable[Any]) -> Any:
    return await work


class HookGate(HookPoints):
    def __init__(self, hooks: Dispatcher, hook_run: HookRun) -> None:
        self.hooks = hooks
        self.run = hook_run
        self._race: Race = _unraced
        # The next model call's hooks, asked ahead: its turn, the call asked about, the answer.
        self._ahead: tuple[int, pb.ModelCall, Paused | ModelDecision] | None = None
        # Before-tool decisions asked ahead, with the approvals.
        self._decided: dict[str, ToolDecision] = {}
        # Ids of output items made ahead (for the next model call's hooks asked ahead), by call
        # id: the items added then are the same items.
        self._item_ids: dict[str, str] = {}

    def bind(self, response: pb.Response, race: Race) -> None:
        """The response this run builds (hooks learn its id, model and metadata), and how the run
        waits for a hook call."""
        self._race = race
        context = self.run.context
        context.response_id = response.id
        context.model = response.model
        context.previous_response_id = response.previous_response_id
        context.metadata.update(response.metadata)

    def wants(self, point: int) -> bool:
        return self.hooks.wants(point)

    @property
    def pauses(self) -> bool:
        return self.hooks.wants(P.HOOK_POINT_PAUSE_CHECK)

    @property
    def asked_before_model(self) -> bool:
        """Whether hooks are asked before a model call (a pause check or before-model hooks)."""
        return self.pauses or self.hooks.wants(P.HOOK_POINT_BEFORE_MODEL)

    @property
    def asks_ahead(self) -> bool:
        return self.hooks.wants(P.HOOK_POINT_AFTER_TOOL) and self.asked_before_model

    def events(self, emitter: ResponseEmitter, *, ending: bool = False) -> list[pb.StreamEvent]:
        """`hook_failed` events for the fail-open failures since the last call; HookFailed when a
        fail-closed hook could not see an observation sent on its own (`ending`: the response has
        its end already, and a fail-closed failure there is in it — nothing is raised)."""
        if ending:
            self.run.closed = None
        else:
            self.run.raise_closed()
        if not self.run.failures:
            return []
        return [emitter.hook_failed(_event(f)) for f in self.run.take_failures()]

    def flush(self) -> None:
        """The run is about to wait (on the model, tools, a client): observations held for a
        hook's next exchange go now."""
        if self.run.held:
            self.hooks.flush(self.run)

    def totals(self) -> tuple[int, int, float]:
        return self.run.calls, self.run.failed, self.run.seconds

    def item_id(self, call_id: str, make: Callable[[], str] | None = None) -> str:
        if make is not None:
            return self._item_ids.setdefault(call_id, make())
        return self._item_ids.pop(call_id, "")

    # -- before the response and each model call -------------------------------------------------

    async def admit(
        self, request: pb.CreateResponseRequest, problems: Problems, first: TurnRequest | None
    ) -> pb.CreateResponseRequest:
        """The before-response hooks: the request to run (HookRejected, HookFailed to refuse it).
        `first`: the first model call, when the response starts with one: its hooks are asked
        ahead, in the same exchange, and their answer kept for that call if nothing changed."""
        if first is None:
            return await self.hooks.before_response(self.run, request, problems)
        call = model_call_of(first)
        admitted, ahead = await self.hooks.admit(self.run, request, problems, call, self.pauses)
        if ahead is not None:
            self._ahead = (1, call, ahead)
        return admitted

    def early(self, request: TurnRequest) -> TurnRequest | None:
        """The first model call, if it may start before anything else: its hooks were asked
        ahead about this very call and neither paused nor answered it."""
        if not self.asked_before_model:
            return request
        decision = self._asked_ahead(1, model_call_of(request))
        if decision is None or isinstance(decision, Paused) or decision.answer is not None:
            return None  # the turn boundary takes it
        self._ahead = None
        return _apply(request, decision.call)

    async def before_model(self, turn: int, request: TurnRequest, pause: bool) -> Paused | TurnRequest | Completion:
        """At a turn boundary: a hook's pause (when `pause`: not asked yet at this boundary), the
        call to make (changed by hooks), or a hook's answer in the model's place."""
        first_check = pause
        pause = pause and self.pauses
        if not (pause or self.wants(P.HOOK_POINT_BEFORE_MODEL)):
            return request
        call = model_call_of(request)
        decision = self._asked_ahead(turn, call) if first_check else None
        self._ahead = None  # asked about once: whatever comes next is asked again
        if decision is None:
            decision = await self._race(self.hooks.model_turn(self._at(turn), call, turn, pause))
        if isinstance(decision, Paused):
            return decision
        if decision.answer is not None:
            return Completion(decision.answer)
        return _apply(request, decision.call)

    def after_model(self, turn: int, output: Sequence[pb.Item], spent: tuple[int, int, int]) -> None:
        if self.wants(P.HOOK_POINT_AFTER_MODEL):
            usage = pb.Usage(input_tokens=spent[0], output_tokens=spent[1], total_tokens=spent[2])
            self.hooks.after_model(self._at(turn), output, usage)

    async def after_response(self, response: pb.Response) -> Failed | None:
        """Audit hooks see the response as it ends, and every observation is delivered; a
        fail-closed failure is the response's end instead."""
        try:
            await self.hooks.after_response(self.run, response)
            self.run.raise_closed()
        except HookFailed as failed:
            return Failed("hook_failed", str(failed))
        return None

    def _asked_ahead(self, turn: int, call: pb.ModelCall) -> Paused | ModelDecision | None:
        """The answer asked ahead, if it was this very call that was asked about."""
        if self._ahead is None:
            return None
        asked_turn, asked, decision = self._ahead
        return decision if turn == asked_turn and asked == call else None

    def _at(self, turn: int) -> HookRun:
        self.run.context.turn = turn
        return self.run

    # -- tools ------------------------------------------------------------------------------------

    async def before_tools(
        self, calls: list[pb.FunctionCall], routes: Mapping[str, Route], pause: bool
    ) -> Paused | Gated:
        """Before a turn's calls start: a hook's pause (when `pause`), else the approve-tool hooks
        on each call. The before-tool hooks of the calls that will run at once are asked in the
        same exchange; `before_tool` uses their decisions."""
        pause = pause and self.pauses
        if not (pause or self.wants(P.HOOK_POINT_APPROVE_TOOL) or self.wants(P.HOOK_POINT_BEFORE_TOOL)):
            return Gated(calls, [], set())

        def ahead(call: pb.FunctionCall) -> bool:
            route = routes[call.name]
            return route.executor is not None and not needs_approval(call.name, route.tool)

        routed = [(call, routes[call.name].tool) for call in calls]
        decided = await self._race(self.hooks.before_tools(self.run, routed, pause, ahead))
        if isinstance(decided, Paused):
            return decided
        self._decided.update(decided.decided)
        gated = Gated([], [], set())
        for call in calls:
            approval = decided.approvals.get(call.call_id)
            if approval is not None and not approval.approved:
                # The model sees the hook's reason, never where the hook runs.
                reason = "denied by a policy hook" + (f": {approval.reason}" if approval.reason else "")
                gated.denied.append(pb.FunctionCallOutput(call_id=call.call_id, output=reason, is_error=True))
                continue
            if approval is not None:
                gated.approved.add(call.call_id)
            gated.calls.append(call)
        return gated

    async def before_tool(self, call: pb.FunctionCall, tool: pb.Tool) -> ToolDecision | None:
        decision = self._decided.pop(call.call_id, None)
        if decision is None and self.wants(P.HOOK_POINT_BEFORE_TOOL):
            decision = await self.hooks.before_tool(self.run, call, tool)
        return decision

    async def after_tool(
        self, call: pb.FunctionCall, result: pb.FunctionCallOutput, following: Following | None
    ) -> pb.FunctionCallOutput:
        if not self.wants(P.HOOK_POINT_AFTER_TOOL):
            return result
        ahead = following(result) if following is not None else None
        if ahead is None or not self.asked_before_model:
            return await self.hooks.after_tool(self.run, call, result)
        turn, request = ahead
        model_call = model_call_of(request)
        result, decided = await self.hooks.after_tool_ahead(self.run, call, result, model_call, turn - 1, self.pauses)
        if decided is not None:
            self._ahead = (turn, model_call, decided)
        return result


def _event(failure: HookFailure) -> pb.HookFailedEvent:
    return pb.HookFailedEvent(hook=failure.hook, point=failure.point, error=failure.error, call_id=failure.call_id)  # type: ignore[arg-type]


def model_call_of(request: TurnRequest) -> pb.ModelCall:
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
