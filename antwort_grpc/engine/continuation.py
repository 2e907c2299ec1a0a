"""What a continued response starts with: pure, over the history and the request's new items.

A continuation answers what the previous response left open: function_call_output items for
calls waiting for a result, approval_response items for calls waiting for a decision. Each must
name a call that actually waits; then the server-side calls the model made (and nobody answered)
run before the first model turn, denied calls get their error output, and client-executed calls
approved just now are handed to the client.
"""

from __future__ import annotations

from collections.abc import Sequence

from antwort_grpc import pb
from antwort_grpc.engine import policy
from antwort_grpc.engine.run import Continuation
from antwort_grpc.engine.tools import ToolSet
from antwort_grpc.errors import FieldViolation


def resolve(
    history: Sequence[pb.Item],
    model_call_ids: set[str],
    new_items: Sequence[pb.Item],
    tools: ToolSet,
    choice: pb.ToolChoice | None,
) -> tuple[Continuation, list[FieldViolation]]:
    """The continuation, or the field violations of new items that answer nothing."""
    open_calls: dict[str, pb.FunctionCall] = {}
    requested: dict[str, pb.ApprovalRequest] = {}
    decided: dict[str, pb.ApprovalResponse] = {}
    for item in history:
        _track(item, open_calls, requested, decided)
    violations: list[FieldViolation] = []
    new_decisions: dict[str, pb.ApprovalResponse] = {}
    for n, item in enumerate(new_items):
        kind = item.WhichOneof("kind")
        at = f"input_items.items[{n}]"
        if kind == "function_call_output" and item.function_call_output.call_id not in open_calls:
            violations.append(
                FieldViolation(
                    f"{at}.function_call_output.call_id",
                    f"{item.function_call_output.call_id!r} matches no call waiting for an output",
                )
            )
            continue
        if kind == "approval_response":
            call_id = item.approval_response.call_id
            if call_id not in requested or call_id in decided:
                violations.append(
                    FieldViolation(
                        f"{at}.approval_response.call_id", f"{call_id!r} matches no call waiting for approval"
                    )
                )
                continue
            new_decisions[call_id] = item.approval_response
        elif kind == "approval_request":
            violations.append(FieldViolation(f"{at}.approval_request", "approval requests are made by the server"))
            continue
        _track(item, open_calls, requested, decided)
    result = Continuation()
    if violations:
        return result, violations
    allowed = policy.allowed_names(choice)
    for call_id, call in open_calls.items():
        if call_id not in model_call_ids:
            continue  # only calls the model made run anywhere on our side
        route = tools.routes.get(call.name)
        if route is None:
            continue  # not offered by this request: left as it is
        decision = decided.get(call_id)
        if call_id in requested and decision is None:
            continue  # still undecided
        if decision is not None and not decision.approve:
            if call_id in new_decisions:
                result.outputs.append(policy.denied_output(call, decision.reason))
            continue
        if route.executor is None:
            if call_id in new_decisions:
                result.handoff.append(call)
            continue
        if policy.choice_kind(choice) == "none":
            continue
        if allowed is not None and call.name not in allowed:
            result.outputs.append(policy.error_output(call, f"tool {call.name!r} is not allowed (allowed_tools)"))
            continue
        result.calls.append(call)
    return result, []


def _track(
    item: pb.Item,
    open_calls: dict[str, pb.FunctionCall],
    requested: dict[str, pb.ApprovalRequest],
    decided: dict[str, pb.ApprovalResponse],
) -> None:
    kind = item.WhichOneof("kind")
    if kind == "function_call":
        open_calls[item.function_call.call_id] = item.function_call
    elif kind == "function_call_output":
        open_calls.pop(item.function_call_output.call_id, None)
    elif kind == "approval_request":
        requested[item.approval_request.call_id] = item.approval_request
    elif kind == "approval_response":
        decided[item.approval_response.call_id] = item.approval_response
