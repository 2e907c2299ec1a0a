"""One turn of the loop: a model call and where it leads, ending in one typed outcome.

A turn is a Step: iterate its events, then read its result — RunAgain (tool results or a
steering message for the model to see), NextRound (a follow-up waits), or how the response ends.
Where it goes is decided by pure rules (turn_rules.py, budget.py); this file only sequences them
with the model call (model_call.py), the hooks (hook_gate.py) and the tools (tool_turn.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from antwort_grpc import pb
from antwort_grpc.engine import turn_rules
from antwort_grpc.engine.budget import limit_reached, tool_calls_exceed
from antwort_grpc.engine.checkpoints import checkpoint
from antwort_grpc.engine.gated_tools import GatedTools
from antwort_grpc.engine.model_call import (
    add_completion,
    answered_by_hook,
    await_completion,
    call_model,
    stream_turn,
    turn_request,
)
from antwort_grpc.engine.model_task import ModelCall
from antwort_grpc.engine.outcomes import (
    Completed,
    Incomplete,
    NextRound,
    RunAgain,
    TurnOutcome,
)
from antwort_grpc.engine.run import Run
from antwort_grpc.engine.step import Step
from antwort_grpc.engine.tool_turn import add_outputs, supersede
from antwort_grpc.hooks.dispatch import Paused
from antwort_grpc.providers.base import Completion, FinishReason, Provider

RESPOND: int = pb.TurnDecision.TURN_DECISION_RESPOND
CALL_TOOLS: int = pb.TurnDecision.TURN_DECISION_CALL_TOOLS
INTERRUPTED: int = pb.TurnDecision.TURN_DECISION_INTERRUPTED


@dataclass(frozen=True, slots=True)
class TurnSettings:
    provider: Provider
    # False for an engine without executors: single-shot, tool calls are returned as they are.
    loop_enabled: bool
    approval_timeout: float
    # Stores the response as it is (after tool results).
    save: Callable[[Run], Awaitable[None]]
    # The provider joins deltas that waited in one read of its backend (providers/coalesce.py):
    # deltas that waited on the run's side are joined too.
    coalescing: bool = False


class Turn(Step[TurnOutcome]):
    def __init__(self, run: Run, settings: TurnSettings) -> None:
        super().__init__()
        self.run = run
        self.settings = settings
        self.number = 0
        self.began = 0.0
        self.call: ModelCall | None = None
        # How the model's answer ended (None: a steering message cut it short).
        self.finish: FinishReason | None = FinishReason.STOP
        self.calls: list[pb.FunctionCall] = []

    async def events(self) -> AsyncIterator[pb.StreamEvent]:
        # Sub-steps that usually have nothing to say are entered only when they do: every async
        # generator costs a few microseconds to start, and this runs once per turn.
        run = self.run
        if run.durable is not None:  # a coroutine less per turn for a plain run
            await run.save_checkpoint()
        if run.needs_checkpoint:
            async for event in checkpoint(run):
                yield event
        if not self._begin():
            return
        if self.call is None:
            async for event in self._ask_hooks_then_call():
                yield event
        yield run.emitter.turn_started(self.number, run.round)
        run.emitter.start_turn()
        assert self.call is not None
        if self.call.streaming:
            async for step in stream_turn(run, self.call, self._merge()):
                if type(step) is pb.StreamEvent:
                    yield step
                else:
                    self.finish = step  # type: ignore[assignment]
        else:
            for event in await self._complete():
                yield event
        ended = self._model_ended()
        decided, screened = self._decide()
        for event in ended + decided:
            yield event
        if screened is not None:
            async for event in self._tools(screened):
                yield event

    def _begin(self) -> bool:
        """The turn starts unless a limit ends the response first; its model call starts here
        unless hooks are asked before it (or one started early)."""
        run = self.run
        if (reason := limit_reached(run.limits, run.turn, run.response.usage.output_tokens)) is not None:
            self.end(Incomplete(reason))
            return False
        self.number = run.next_turn()
        self.began = asyncio.get_running_loop().time()
        self.call = run.take_early()
        if self.call is None and not run.hooks.asked_before_model:
            self.call = call_model(run, self.settings.provider, turn_request(run, self.number))
        return True

    def _merge(self) -> bool:
        return self.settings.coalescing and not self.run.request.delta_coalescing.disabled

    def completed(self) -> pb.StreamEvent:
        return self.run.emitter.turn_completed(self.number, asyncio.get_running_loop().time() - self.began)

    # -- the model call ---------------------------------------------------------------------------

    async def _ask_hooks_then_call(self) -> AsyncIterator[pb.StreamEvent]:
        """The turn's model call after the hooks asked before it: a pause check waits here; an
        answer replaces the call; changes apply to it."""
        run = self.run
        hooks = run.hooks
        pause = True
        while True:
            decided = await hooks.before_model(self.number, turn_request(run, self.number), pause)
            for event in hooks.events(run.emitter):
                yield event
            if not isinstance(decided, Paused):
                break
            run.pause(decided.reason)
            pause = False
            async for event in checkpoint(run):
                yield event
        if isinstance(decided, Completion):
            self.call = answered_by_hook(run, decided)
        else:
            self.call = call_model(run, self.settings.provider, decided)

    async def _complete(self) -> list[pb.StreamEvent]:
        assert self.call is not None
        completion = await await_completion(self.run, self.call)
        if completion is None:
            self.finish = None
            return []
        self.finish = completion.finish
        return add_completion(self.run, completion)

    def _model_ended(self) -> list[pb.StreamEvent]:
        """The model's items join the conversation; its metrics, then the after-model hooks."""
        run = self.run
        produced = list(run.emitter.turn_items)
        run.append(produced)
        assert self.call is not None
        spent = run.record.model_ended(self.number, run.response.usage, by_hook=self.call.answered)
        self.calls = [i.function_call for i in produced if i.WhichOneof("kind") == "function_call"]
        run.hooks.after_model(self.number, produced, spent)
        return run.hooks.events(run.emitter)

    # -- where it goes ----------------------------------------------------------------------------

    def _decide(self) -> tuple[list[pb.StreamEvent], turn_rules.Screened | None]:
        """Where the turn goes: its events, and the calls that go on to the tools (None: the turn
        ended, its result is set)."""
        run = self.run
        emitter = run.emitter
        if self.finish is None:
            # Cut short by a steering message: its calls never run.
            events = [emitter.turn_decided(self.number, INTERRUPTED, len(self.calls))]
            events += supersede(run, self.calls)
            events.append(self.completed())
            self.end(RunAgain())
            return events, None
        choice = run.request.tool_choice if run.request.HasField("tool_choice") else None
        screened = turn_rules.screen_turn(
            finish=self.finish,
            calls=self.calls,
            choice=choice,
            loop_enabled=self.settings.loop_enabled,
            known=run.tools.routes,
        )
        events = [emitter.turn_decided(self.number, CALL_TOOLS if self.calls else RESPOND, len(self.calls))]
        if isinstance(screened, Completed | Incomplete):
            events.append(self.completed())
            self.end(_answered(run, screened))
            return events, None
        if tool_calls_exceed(run.limits, run.record.tool_calls, _server_calls(run, screened.accepted)):
            events += add_outputs(run, screened.rejected)
            events.append(self.completed())
            self.end(Incomplete("max_tool_calls"))
            return events, None
        return events, screened

    async def _tools(self, screened: turn_rules.Screened) -> AsyncIterator[pb.StreamEvent]:
        """Before the calls start: pause, then approvals; then the calls run, or the client's
        (gated_tools.py: the sequence a response that starts with calls goes through too)."""
        run = self.run
        if run.needs_checkpoint:
            async for event in checkpoint(run, inject=False):
                yield event
        tools = GatedTools(run, screened, self.settings.approval_timeout, self.settings.save)
        async for event in tools.events():
            yield event
        yield self.completed()
        self.end(tools.result or RunAgain())


def _answered(run: Run, screened: Completed | Incomplete) -> TurnOutcome:
    """The model answered: the response ends — unless a steering message came during the answer
    (answered next) or a follow-up waits (a new round)."""
    if isinstance(screened, Completed):
        if run.steered:
            return RunAgain()
        if run.follow_up_waiting:
            return NextRound()
    return screened


def _server_calls(run: Run, calls: list[pb.FunctionCall]) -> int:
    server_side = run.tools.server_side
    return sum(1 for c in calls if c.name in server_side)
