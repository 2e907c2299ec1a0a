"""The tool part of a turn: the gate before calls start (pause, approvals by hooks or a client, a
steering message that supersedes them) and running the server-side calls concurrently, with their
outputs fed back in the model's order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from antwort_grpc import pb
from antwort_grpc.engine import policy
from antwort_grpc.engine.checkpoints import checkpoint
from antwort_grpc.engine.emitter import new_item_id
from antwort_grpc.engine.governor import Following
from antwort_grpc.engine.model_call import turn_request
from antwort_grpc.engine.outcomes import ExecuteTools, RequiresAction
from antwort_grpc.engine.run import APPROVAL, TOOLS, Run, Stopped
from antwort_grpc.hooks.dispatch import Paused
from antwort_grpc.providers.base import TurnRequest


async def gate(
    run: Run, screened: policy.Screened, approval_timeout: float
) -> AsyncIterator[pb.StreamEvent | RequiresAction | ExecuteTools]:
    """Approvals before the calls start; then where the turn goes (yielded last). A client's
    decision is awaited up to `approval_timeout` seconds, then the call is denied ("timeout")."""
    accepted, rejected = list(screened.accepted), list(screened.rejected)
    routes = run.tools.routes
    server_side = run.tools.server_side
    pause = True
    while True:
        if run.steer:
            # A steering message came before the calls started: none of them runs.
            yield ExecuteTools([], rejected + supersede_outputs(run, accepted))
            return
        # A hook's pause check, then approve-tool hooks decide first, on the same path as a
        # client's decision.
        gated = await run.governor.before_tools(accepted, routes, pause)
        for event in run.governor.hook_events(run.emitter):
            yield event
        if not isinstance(gated, Paused):
            break
        run.pause_reason, pause = gated.reason, False
        async for event in checkpoint(run, inject=False):
            yield event
    accepted, denied, hook_approved = gated
    rejected += denied
    waiting = [
        c for c in accepted if c.call_id not in hook_approved and policy.needs_approval(c.name, routes[c.name].tool)
    ]
    if not waiting:
        yield policy.route_calls(accepted, rejected, server_side)
        return
    requests = [approval_request(c, routes[c.name].tool) for c in waiting]
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
    async for event in _await_decisions(run, requests, approval_timeout):
        yield event
    if run.steer:
        yield ExecuteTools([], rejected + supersede_outputs(run, accepted))
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


def supersede(run: Run, calls: Sequence[pb.FunctionCall]) -> list[pb.StreamEvent]:
    """Calls that will not run because a steering message came: each still gets its output
    before the injected message, so the history stays valid for Chat Completions backends."""
    return add_outputs(run, supersede_outputs(run, list(calls)))


def supersede_outputs(run: Run, calls: list[pb.FunctionCall]) -> list[pb.FunctionCallOutput]:
    run.superseded += [c.call_id for c in calls]
    run.decisions, run.awaiting = {}, {}
    return [policy.error_output(c, policy.SUPERSEDED) for c in calls]


async def _await_decisions(
    run: Run, requests: list[pb.ApprovalRequest], approval_timeout: float
) -> AsyncIterator[pb.StreamEvent]:
    """Wait until every request is decided (each decision is recorded as an approval_response
    output item when it arrives), a steering message comes, the approval timeout passes
    (undecided ones are denied with reason "timeout"), or the controlling client goes away."""
    run.awaiting = {r.call_id: r for r in requests}
    run.governor.flush()
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


async def execute(run: Run, plan: ExecuteTools) -> AsyncIterator[pb.StreamEvent]:
    """Run a turn's server-side calls concurrently; outputs go back in the model's order."""
    run.governor.flush()
    emitter = run.emitter
    items = {i.function_call.call_id: (i, n) for n, i in enumerate(run.response.output)}
    queue: asyncio.Queue[tuple[int, str | pb.FunctionCallOutput]] = asyncio.Queue()
    results: dict[int, pb.FunctionCallOutput] = {}
    tasks: list[asyncio.Task[None]] = []

    following = _following(run, plan)

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
                raise Stopped
            if run.governor.failed_call is not None:
                break  # FAIL mode: the calls still running are cancelled; outputs so far kept
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    outputs = [results[p] for p in range(len(plan.calls)) if p in results]
    for event in add_outputs(run, in_model_order(run, outputs + list(plan.rejected))):
        yield event


def _following(run: Run, plan: ExecuteTools) -> Following | None:
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
        for output in in_model_order(run, [result, *plan.rejected]):
            # Made as `_add_outputs` will make it, under the id it will have.
            item_id = run.output_ids.setdefault(output.call_id, new_item_id("function_call_output"))
            items.append(pb.Item(id=item_id, status=pb.ItemStatus.ITEM_STATUS_COMPLETED, function_call_output=output))
        turn = run.turn + 1
        return turn, turn_request(run, turn, run.context + items)

    return following


def add_outputs(run: Run, outputs: Sequence[pb.FunctionCallOutput]) -> list[pb.StreamEvent]:
    emitter = run.emitter
    events: list[pb.StreamEvent] = []
    emitter.start_turn()
    for output in outputs:
        item_id = run.output_ids.pop(output.call_id, "")
        events += emitter.add_item(pb.Item(id=item_id, function_call_output=output))
    run.context += emitter.turn_items
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
