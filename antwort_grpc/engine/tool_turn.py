"""The tool part of a turn: the gate before calls start (pause, approvals by hooks or a client, a
steering message that supersedes them) and running the server-side calls concurrently — each
within its timeout, between its hooks — with their outputs fed back in the model's order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Collection, Sequence

from antwort_grpc import pb
from antwort_grpc.engine import turn_rules
from antwort_grpc.engine.budget import ToolTimeouts, limit_reached
from antwort_grpc.engine.channel import RING, Channel
from antwort_grpc.engine.checkpoints import checkpoint
from antwort_grpc.engine.emitter import new_item_id
from antwort_grpc.engine.hook_gate import Following, Gated
from antwort_grpc.engine.model_call import turn_request
from antwort_grpc.engine.outcomes import ExecuteTools, Failed, RequiresAction
from antwort_grpc.engine.run import Run, Stopped
from antwort_grpc.engine.step import Step
from antwort_grpc.engine.tools import Route
from antwort_grpc.engine.turn_rules import Screened
from antwort_grpc.executors.base import ProgressSink, ToolTimeoutSource
from antwort_grpc.hooks.dispatch import Paused
from antwort_grpc.providers.base import TurnRequest

FAIL: int = pb.ToolFailureMode.TOOL_FAILURE_MODE_FAIL
ITEM_COMPLETED: int = pb.ItemStatus.ITEM_STATUS_COMPLETED


class ToolGate(Step[RequiresAction | ExecuteTools]):
    """Approvals before the calls start; the result says where the turn goes. A client's decision
    is awaited up to `approval_timeout` seconds, then the call is denied ("timeout").
    `approved`: calls a client approved already (in a continuation's approval_response items)."""

    def __init__(
        self, run: Run, screened: Screened, approval_timeout: float, approved: Collection[str] = frozenset()
    ) -> None:
        super().__init__()
        self.run = run
        self.accepted = list(screened.accepted)
        self.rejected = list(screened.rejected)
        self.approval_timeout = approval_timeout
        self.approved = set(approved)
        self._gated = Gated(self.accepted, [], set())

    async def events(self) -> AsyncIterator[pb.StreamEvent]:
        run = self.run
        async for event in self._hooks():
            yield event
        if self.ended:
            return  # superseded
        gated = self._gated
        self.rejected += gated.denied
        routes = run.tools.routes
        approved = self.approved | gated.approved
        waiting = [
            c
            for c in gated.calls
            if c.call_id not in approved and turn_rules.needs_approval(c.name, routes[c.name].tool)
        ]
        if not waiting:
            self.end(turn_rules.route_calls(gated.calls, self.rejected, run.tools.server_side))
            return
        async for event in self._ask(gated.calls, waiting):
            yield event

    async def _hooks(self) -> AsyncIterator[pb.StreamEvent]:
        """A hook's pause check, then approve-tool hooks decide first, on the same path as a
        client's decision."""
        run = self.run
        pause = True
        while True:
            if run.steered:
                # A steering message came before the calls started: none of them runs.
                self.end(ExecuteTools([], self.rejected + supersede_outputs(run, self.accepted)))
                return
            gated = await run.hooks.before_tools(self.accepted, run.tools.routes, pause)
            for event in run.hooks.events(run.emitter):
                yield event
            if not isinstance(gated, Paused):
                self._gated = gated
                return
            run.pause(gated.reason)
            pause = False
            async for event in checkpoint(run, inject=False):
                yield event

    async def _ask(self, calls: list[pb.FunctionCall], waiting: list[pb.FunctionCall]) -> AsyncIterator[pb.StreamEvent]:
        run = self.run
        routes = run.tools.routes
        server_side = run.tools.server_side
        requests = [approval_request(c, routes[c.name].tool) for c in waiting]
        emitter = run.emitter
        emitter.start_turn()
        for request in requests:
            for event in emitter.add_item(pb.Item(approval_request=request)):
                yield event
        run.append(emitter.turn_items)
        # A decision may come the moment the event is out, before this generator resumes.
        run.await_approvals(requests)
        yield emitter.approval_requested(requests)
        if not run.controller:
            # Nobody can decide now: the response pauses; the client continues it with
            # approval_response items (calls that need no approval run then too).
            free = [c for c in calls if c not in waiting and c.name not in server_side]
            self.end(RequiresAction(free, self.rejected, requests))
            return
        async for event in _await_decisions(run, requests, self.approval_timeout):
            yield event
        if run.steered:
            self.end(ExecuteTools([], self.rejected + supersede_outputs(run, calls)))
            return
        self.end(self._decided(calls, requests))

    def _decided(
        self, calls: list[pb.FunctionCall], requests: list[pb.ApprovalRequest]
    ) -> RequiresAction | ExecuteTools:
        server_side = self.run.tools.server_side
        decisions = self.run.take_decisions()
        undecided = {r.call_id for r in requests if r.call_id not in decisions}
        approved: list[pb.FunctionCall] = []
        for call in calls:
            decision = decisions.get(call.call_id)
            if call.call_id in undecided:
                continue
            if decision is not None and not decision.approve:
                self.rejected.append(turn_rules.denied_output(call, decision.reason))
            else:
                approved.append(call)
        if undecided:
            # The controlling client went away: the rest is decided with a continuation.
            left = [r for r in requests if r.call_id in undecided]
            return RequiresAction([c for c in approved if c.name not in server_side], self.rejected, left)
        return turn_rules.route_calls(approved, self.rejected, server_side)


def supersede(run: Run, calls: Sequence[pb.FunctionCall]) -> list[pb.StreamEvent]:
    """Calls that will not run because a steering message came: each still gets its output
    before the injected message, so the history stays valid for Chat Completions backends."""
    return add_outputs(run, supersede_outputs(run, list(calls)))


def supersede_outputs(run: Run, calls: list[pb.FunctionCall]) -> list[pb.FunctionCallOutput]:
    run.supersede([c.call_id for c in calls])
    return [turn_rules.error_output(c, turn_rules.SUPERSEDED) for c in calls]


async def _await_decisions(
    run: Run, requests: list[pb.ApprovalRequest], approval_timeout: float
) -> AsyncIterator[pb.StreamEvent]:
    """Wait until every request is decided (each decision is recorded as an approval_response
    output item when it arrives), a steering message comes, the approval timeout passes
    (undecided ones are denied with reason "timeout"), or the controlling client goes away."""
    run.hooks.flush()
    emitter = run.emitter
    timeout_at = asyncio.get_running_loop().time() + approval_timeout
    recorded: set[str] = set()
    while True:
        for call_id, decision in list(run.decisions.items()):
            if call_id not in recorded:
                recorded.add(call_id)
                emitter.start_turn()
                for event in emitter.add_item(pb.Item(approval_response=decision)):
                    yield event
                run.append(emitter.turn_items)
        if len(recorded) == len(requests) or run.steered or not run.controller:
            return
        run.check()
        if not await run.wait_for_control(timeout_at):
            run.time_out_approvals()


class ToolRound(Step[Failed | None]):
    """A turn's server-side calls, run concurrently; outputs go back in the model's order. The
    result: the response's end when a call failed and the request's failure mode is FAIL."""

    def __init__(self, run: Run, plan: ExecuteTools) -> None:
        super().__init__()
        self.run = run
        self.plan = plan
        self.timeouts = ToolTimeouts.of(run.request)
        self.fail_on_error = run.request.tool_failure_mode == FAIL
        self.failed: Failed | None = None
        self.queue = Channel()

    async def events(self) -> AsyncIterator[pb.StreamEvent]:
        run = self.run
        run.hooks.flush()
        calls = self.plan.calls
        items = _call_items(run, calls)
        following = _following(run, self.plan)
        tasks: list[asyncio.Task[None]] = []
        for position, call in enumerate(calls):
            if call.call_id in items:
                yield run.emitter.tool_started(*items[call.call_id])
            tasks.append(asyncio.create_task(self._one(position, call, following)))
        results: dict[int, pb.FunctionCallOutput] = {}
        try:
            async for event in self._collect(items, results, len(tasks)):
                yield event
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        outputs = [results[p] for p in range(len(calls)) if p in results]
        for event in add_outputs(run, in_model_order(run, outputs + list(self.plan.rejected))):
            yield event
        self.end(self.failed)

    async def _collect(
        self, items: dict[str, tuple[pb.Item, int]], results: dict[int, pb.FunctionCallOutput], count: int
    ) -> AsyncIterator[pb.StreamEvent]:
        run = self.run
        emitter = run.emitter
        while len(results) < count:
            got = await run.receive(self.queue)
            if got is RING:
                run.check()  # a stop ends the calls; anything else waits for the round's end
                continue
            assert isinstance(got, tuple)
            position: int = got[0]
            update: str | pb.FunctionCallOutput = got[1]
            timed_out: bool = got[2]
            found = items.get(self.plan.calls[position].call_id)
            if isinstance(update, str):
                if found:
                    yield emitter.tool_progress(found[0], found[1], update)
                continue
            results[position] = update
            if found:
                yield emitter.tool_finished(found[0], found[1], update, timed_out)
            for event in run.hooks.events(emitter):
                yield event
            run.check()
            if self.failed is not None:
                return  # FAIL mode: the calls still running are cancelled; outputs so far kept

    async def _one(self, position: int, call: pb.FunctionCall, following: Following | None) -> None:
        run = self.run
        route = run.tools.routes[call.name]
        put = self.queue.put_nowait
        result, timed_out, executed = await run_tool(
            run, call, route, lambda m: put((position, m, False)), self.timeouts, following
        )
        if executed and result.is_error and self.fail_on_error and self.failed is None:
            self.failed = Failed("tool_failed", f"tool call {call.name!r} ({call.call_id}) failed: {result.output}")
        put((position, result, timed_out))


async def run_tool(
    run: Run,
    call: pb.FunctionCall,
    route: Route,
    progress: ProgressSink,
    timeouts: ToolTimeouts,
    following: Following | None = None,
) -> tuple[pb.FunctionCallOutput, bool, bool]:
    """One server-side call: before-tool hooks, the executor within the call's timeout,
    after-tool hooks; every failure an is_error output. The output, whether it timed out, and
    whether the executor ran it (a before-tool hook may answer instead). `following`: for a
    turn's one call, the next model call as it will be with this result (its hooks are asked
    ahead, with the after-tool hooks)."""
    hooks = run.hooks
    result: pb.FunctionCallOutput | None = None
    decision = await hooks.before_tool(call, route.tool)
    if decision is not None:
        call, result = decision.call, decision.result
    executed = result is None
    started = time.perf_counter()
    timed_out = False
    if result is None:
        result, timed_out = await _execute(call, route, progress, timeouts)
    seconds = time.perf_counter() - started
    result.call_id = call.call_id
    fails = executed and result.is_error and run.request.tool_failure_mode == FAIL
    result = await hooks.after_tool(call, result, None if fails else following)
    run.record.tool_call(call.name, seconds, is_error=result.is_error, timed_out=timed_out)
    return result, timed_out, executed


async def _execute(
    call: pb.FunctionCall, route: Route, progress: ProgressSink, timeouts: ToolTimeouts
) -> tuple[pb.FunctionCallOutput, bool]:
    executor = route.executor
    assert executor is not None
    advertised = executor.tool_timeout(call.name) if isinstance(executor, ToolTimeoutSource) else None
    timeout = timeouts.for_tool(call.name, advertised)
    try:
        # Cancelled all the way down on timeout: a remote executor sees its RPC cancelled.
        async with asyncio.timeout(timeout) as limit:
            return await executor.execute(call, route.tool, progress), False
    except TimeoutError:
        if not limit.expired():
            return _error(call, f"tool {call.name!r} failed: TimeoutError"), False
        return _error(call, f"tool {call.name!r} timed out after {timeout:g} s"), True
    except Exception as err:
        return _error(call, f"tool {call.name!r} failed: {err}"), False


def _error(call: pb.FunctionCall, message: str) -> pb.FunctionCallOutput:
    return pb.FunctionCallOutput(call_id=call.call_id, output=message, is_error=True)


def _call_items(run: Run, calls: Sequence[pb.FunctionCall]) -> dict[str, tuple[pb.Item, int]]:
    """The function_call item of each call and its output index, for the tool events. A call an
    earlier response made (a continuation) has index -1: it is an item of that response."""
    wanted = {c.call_id for c in calls}
    found: dict[str, tuple[pb.Item, int]] = {}
    for index, item in enumerate(run.response.output):
        if item.WhichOneof("kind") == "function_call" and item.function_call.call_id in wanted:
            found[item.function_call.call_id] = (item, index)
    if len(found) < len(wanted):
        for item in run.context:
            call_id = item.function_call.call_id if item.WhichOneof("kind") == "function_call" else ""
            if call_id in wanted and call_id not in found:
                found[call_id] = (item, -1)
    return found


def _following(run: Run, plan: ExecuteTools) -> Following | None:
    """For a turn with one server-side call: the next model call as it will be if the call's
    result stays as it is and nothing comes first (a stop, a pause, a steering message, a
    limit), so that its hooks can be asked ahead, with the call's after-tool hooks."""
    hooks = run.hooks
    if len(plan.calls) != 1 or not hooks.asks_ahead:
        return None

    def following(result: pb.FunctionCallOutput) -> tuple[int, TurnRequest] | None:
        if run.stop_reason or run.steered or run.pause_reason is not None:
            return None
        if limit_reached(run.limits, run.turn, run.response.usage.output_tokens) is not None:
            return None
        items = []
        for output in in_model_order(run, [result, *plan.rejected]):
            # Made as `add_outputs` will make it, under the id it will have.
            item_id = hooks.item_id(output.call_id, lambda: new_item_id("function_call_output"))
            items.append(pb.Item(id=item_id, status=ITEM_COMPLETED, function_call_output=output))  # type: ignore[arg-type]
        turn = run.turn + 1
        return turn, turn_request(run, turn, [*run.context, *items])

    return following


def add_outputs(run: Run, outputs: Sequence[pb.FunctionCallOutput]) -> list[pb.StreamEvent]:
    emitter = run.emitter
    events: list[pb.StreamEvent] = []
    emitter.start_turn()
    for output in outputs:
        item_id = run.hooks.item_id(output.call_id)
        events += emitter.add_item(pb.Item(id=item_id, function_call_output=output))
    run.append(emitter.turn_items)
    return events


def in_model_order(run: Run, outputs: Sequence[pb.FunctionCallOutput]) -> list[pb.FunctionCallOutput]:
    """The order of the calls in the response's output (outputs of no call there last)."""
    by_call = {o.call_id: o for o in outputs}
    ordered = [
        by_call.pop(i.function_call.call_id)
        for i in run.response.output
        if i.WhichOneof("kind") == "function_call" and i.function_call.call_id in by_call
    ]
    return ordered + list(by_call.values())


def approval_request(call: pb.FunctionCall, tool: pb.Tool) -> pb.ApprovalRequest:
    label = tool.mcp.server_label if tool.WhichOneof("kind") == "mcp" else ""
    return pb.ApprovalRequest(call_id=call.call_id, name=call.name, arguments=call.arguments, server_label=label)


__all__ = ["Stopped", "ToolGate", "ToolRound", "add_outputs", "run_tool", "supersede"]
