"""Calls through their gate, then run: the one sequence both a turn's calls (turn.py) and the calls
a response starts with (a continuation's, or a resumed background run's; loop.py) go through.

The gate (tool_turn.ToolGate: pause, hooks, approvals, a steering message) decides; calls that
pass run (tool_turn.ToolRound) — a background run checkpointed first, so a replica that resumes
it knows they may have run — and the response is stored with their outputs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Collection

from antwort_grpc import pb
from antwort_grpc.engine.outcomes import ExecuteTools, Failed, RequiresAction
from antwort_grpc.engine.run import Run
from antwort_grpc.engine.step import Step
from antwort_grpc.engine.tool_turn import ToolGate, ToolRound, add_outputs
from antwort_grpc.engine.turn_rules import Screened


class GatedTools(Step[RequiresAction | Failed | None]):
    """The result: RequiresAction when the gate hands calls or approvals to the client (the
    outputs of the calls it rejected are added), the response's end when a call failed under
    the FAIL failure mode, else None (the outputs are in: the model goes on)."""

    def __init__(
        self,
        run: Run,
        screened: Screened,
        approval_timeout: float,
        save: Callable[[Run], Awaitable[None]],
        approved: Collection[str] = frozenset(),
        *,
        gate: bool = True,
    ) -> None:
        """`approved`: calls a client approved already. `gate`: False when there are no calls to
        gate (a continuation that starts with outputs only: its hooks are not asked)."""
        super().__init__()
        self.run = run
        self.screened = screened
        self.approval_timeout = approval_timeout
        self.save = save
        self.approved = approved
        self.gate = gate

    async def events(self) -> AsyncIterator[pb.StreamEvent]:
        run = self.run
        plan: RequiresAction | ExecuteTools = ExecuteTools([], list(self.screened.rejected))
        if self.gate:
            gate = ToolGate(run, self.screened, self.approval_timeout, self.approved)
            async for event in gate.events():
                yield event
            plan = gate.result
        if isinstance(plan, RequiresAction):
            for event in add_outputs(run, plan.rejected):
                yield event
            self.end(plan)
            return
        if not plan.calls and not plan.rejected:
            self.end(None)
            return
        # The calls are about to run: a replica that resumes the run knows they may have.
        await run.save_checkpoint()
        tools = ToolRound(run, plan)
        async for event in tools.events():
            yield event
        # Tool results can be expensive to redo: a crash from here on keeps them.
        await run.wait_for(self.save(run))
        self.end(tools.result)
