"""What a continued response starts with: pure, over the history and the request's new items.

A continuation answers what the previous response left open: function_call_output items for
calls waiting for a result, approval_response items for calls waiting for a decision. Each must
name a call that actually waits; then the server-side calls the model made (and nobody answered)
run before the first model turn — through the same approval and hook gates as any call — denied
calls get their error output, and client-executed calls approved just now are handed to the client.

A server-side call runs only as the model made it (its name and arguments from the response that
holds it, never from the client's items) and only once: a call id that already has an output, or
a new function_call item that reuses a call id of the conversation, is refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from antwort_grpc import pb
from antwort_grpc.engine import turn_rules
from antwort_grpc.engine.run import Continuation
from antwort_grpc.engine.tools import ToolSet
from antwort_grpc.errors import FieldViolation


@dataclass(slots=True)
class _Calls:
    """The calls of a conversation and where each stands."""

    ids: set[str] = field(default_factory=set)
    open: dict[str, pb.FunctionCall] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)
    requested: set[str] = field(default_factory=set)
    decided: dict[str, pb.ApprovalResponse] = field(default_factory=dict)

    def track(self, item: pb.Item) -> None:
        kind = item.WhichOneof("kind")
        if kind == "function_call":
            self.ids.add(item.function_call.call_id)
            self.open[item.function_call.call_id] = item.function_call
        elif kind == "function_call_output":
            self.open.pop(item.function_call_output.call_id, None)
            self.answered.add(item.function_call_output.call_id)
        elif kind == "approval_request":
            self.requested.add(item.approval_request.call_id)
        elif kind == "approval_response":
            self.decided[item.approval_response.call_id] = item.approval_response


def resolve(
    history: Sequence[pb.Item],
    model_calls: Mapping[str, pb.FunctionCall],
    new_items: Sequence[pb.Item],
    tools: ToolSet,
    choice: pb.ToolChoice | None,
) -> tuple[Continuation, list[FieldViolation]]:
    """The continuation, or the field violations of new items that answer nothing."""
    if not history and all(item.WhichOneof("kind") == "message" for item in new_items):
        return Continuation(), []  # a new conversation of messages: nothing to continue
    calls = _Calls()
    for item in history:
        calls.track(item)
    violations: list[FieldViolation] = []
    new_decisions: dict[str, pb.ApprovalResponse] = {}
    for n, item in enumerate(new_items):
        violation = _check(item, f"input_items.items[{n}]", calls)
        if violation is not None:
            violations.append(violation)
            continue
        if item.WhichOneof("kind") == "approval_response":
            new_decisions[item.approval_response.call_id] = item.approval_response
        calls.track(item)
    if violations:
        return Continuation(), violations
    return _plan(calls, model_calls, new_decisions, tools, choice), []


def _check(item: pb.Item, at: str, calls: _Calls) -> FieldViolation | None:
    kind = item.WhichOneof("kind")
    if kind == "function_call_output":
        call_id = item.function_call_output.call_id
        if call_id in calls.answered:
            return FieldViolation(f"{at}.function_call_output.call_id", f"call {call_id!r} already has an output")
        if call_id not in calls.open:
            return FieldViolation(
                f"{at}.function_call_output.call_id", f"{call_id!r} matches no call waiting for an output"
            )
    elif kind == "function_call" and item.function_call.call_id in calls.ids:
        return FieldViolation(
            f"{at}.function_call.call_id",
            f"call id {item.function_call.call_id!r} is already used in this conversation",
        )
    elif kind == "approval_response":
        call_id = item.approval_response.call_id
        if call_id not in calls.requested or call_id in calls.decided:
            return FieldViolation(
                f"{at}.approval_response.call_id", f"{call_id!r} matches no call waiting for approval"
            )
    elif kind == "approval_request":
        return FieldViolation(f"{at}.approval_request", "approval requests are made by the server")
    return None


def _plan(
    calls: _Calls,
    model_calls: Mapping[str, pb.FunctionCall],
    new_decisions: Mapping[str, pb.ApprovalResponse],
    tools: ToolSet,
    choice: pb.ToolChoice | None,
) -> Continuation:
    result = Continuation()
    allowed = turn_rules.allowed_names(choice)
    for call_id in calls.open:
        call = model_calls.get(call_id)
        if call is None:
            continue  # only calls the model made run anywhere on our side, as it made them
        route = tools.routes.get(call.name)
        if route is None:
            continue  # not offered by this request: left as it is
        decision = calls.decided.get(call_id)
        if call_id in calls.requested and decision is None:
            continue  # still undecided
        if decision is not None and not decision.approve:
            if call_id in new_decisions:
                result.outputs.append(turn_rules.denied_output(call, decision.reason))
            continue
        if route.executor is None:
            if call_id in new_decisions:
                result.handoff.append(call)
            continue
        if turn_rules.choice_kind(choice) == "none":
            continue
        if allowed is not None and call.name not in allowed:
            result.outputs.append(turn_rules.error_output(call, f"tool {call.name!r} is not allowed (allowed_tools)"))
            continue
        if decision is not None:
            result.approved.add(call_id)
        result.calls.append(call)
    return result
