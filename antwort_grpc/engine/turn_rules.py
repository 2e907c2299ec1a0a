"""Pure decisions of the loop: tool_choice per turn, which calls may run, and where a turn goes.

No I/O here: everything is a function of plain data, tested with tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from antwort_grpc import pb
from antwort_grpc.engine.outcomes import Completed, ExecuteTools, Incomplete, RequiresAction
from antwort_grpc.providers.base import FinishReason

Mode = pb.ToolChoiceMode


def choice_kind(choice: pb.ToolChoice | None) -> str:
    """ "auto", "none", "required", "function" or "allowed_tools"."""
    if choice is None:
        return "auto"
    which = choice.WhichOneof("choice")
    if which == "mode":
        if choice.mode == Mode.TOOL_CHOICE_MODE_NONE:
            return "none"
        if choice.mode == Mode.TOOL_CHOICE_MODE_REQUIRED:
            return "required"
        return "auto"
    return which or "auto"


def turn_tool_choice(choice: pb.ToolChoice | None, turn: int) -> pb.ToolChoice | None:
    """The choice sent to the model on `turn` (1-based).

    A required or forced choice applies to the first turn only; afterwards it falls back to auto,
    otherwise a model that obeys it could never give a final answer and every loop would run to
    the turn limit. `none` and allowed-tools restrictions hold on every turn.
    """
    if choice is None or turn == 1:
        return choice
    kind = choice_kind(choice)
    if kind in ("required", "function"):
        return None
    if kind == "allowed_tools" and choice.allowed_tools.mode == Mode.TOOL_CHOICE_MODE_REQUIRED:
        relaxed = pb.ToolChoice()
        relaxed.allowed_tools.CopyFrom(choice.allowed_tools)
        relaxed.allowed_tools.mode = Mode.TOOL_CHOICE_MODE_AUTO
        return relaxed
    return choice


def allowed_names(choice: pb.ToolChoice | None) -> frozenset[str] | None:
    """The names the model may call, or None for no restriction (empty list = no restriction)."""
    if choice is None or choice.WhichOneof("choice") != "allowed_tools":
        return None
    names = frozenset(choice.allowed_tools.tool_names)
    return names or None


@dataclass(frozen=True, slots=True)
class Screened:
    accepted: list[pb.FunctionCall]
    rejected: list[pb.FunctionCallOutput]


def screen_calls(
    calls: Sequence[pb.FunctionCall],
    known: frozenset[str] | Mapping[str, object],
    allowed: frozenset[str] | None,
) -> Screened:
    """Split calls into those that may run and error outputs for the rest.

    A call to a tool the request does not define, or outside allowed_tools, never runs: not on a
    server, and not on the client either (it is not handed out with requires_action). The model
    gets an is_error output instead and can correct itself.
    """
    accepted: list[pb.FunctionCall] = []
    rejected: list[pb.FunctionCallOutput] = []
    for call in calls:
        if call.name not in known:
            rejected.append(error_output(call, f"tool {call.name!r} is not defined in this request"))
        elif allowed is not None and call.name not in allowed:
            rejected.append(error_output(call, f"tool {call.name!r} is not allowed (allowed_tools: {sorted(allowed)})"))
        else:
            accepted.append(call)
    return Screened(accepted, rejected)


def error_output(call: pb.FunctionCall, message: str) -> pb.FunctionCallOutput:
    return pb.FunctionCallOutput(call_id=call.call_id, output=message, is_error=True)


SUPERSEDED = "superseded by a steering message"


def denied_output(call: pb.FunctionCall, reason: str) -> pb.FunctionCallOutput:
    return error_output(call, f"the call of {call.name!r} was denied" + (f": {reason}" if reason else ""))


def needs_approval(name: str, tool: pb.Tool) -> bool:
    """Whether a call of function `name`, offered by the request's `tool`, waits for a decision."""
    if not tool.HasField("require_approval"):
        return False
    rule = tool.require_approval
    if rule.tool_names:
        return name in rule.tool_names
    return bool(rule.mode == pb.ApprovalMode.APPROVAL_MODE_ALWAYS)


def screen_turn(
    *,
    finish: FinishReason,
    calls: Sequence[pb.FunctionCall],
    choice: pb.ToolChoice | None,
    loop_enabled: bool,
    known: frozenset[str] | Mapping[str, object],
) -> Completed | Incomplete | Screened:
    """Whether a turn ends the response, or which of its calls may go on (and errors for the rest).

    `loop_enabled` is false for an engine without executors (single-shot)."""
    if finish is FinishReason.LENGTH:
        return Incomplete("max_output_tokens")
    if finish is FinishReason.CONTENT_FILTER:
        return Incomplete("content_filter")
    if not calls or not loop_enabled or choice_kind(choice) == "none":
        return Completed()
    return screen_calls(calls, known, allowed_names(choice))


def route_calls(
    accepted: Sequence[pb.FunctionCall],
    rejected: Sequence[pb.FunctionCallOutput],
    server_side: frozenset[str] | Mapping[str, object],
) -> RequiresAction | ExecuteTools:
    """Calls for the client pause the response (the whole turn: server-side calls of the same
    turn run when it is continued); otherwise the server-side calls run now."""
    client = [c for c in accepted if c.name not in server_side]
    if client:
        return RequiresAction(client, list(rejected))
    return ExecuteTools(list(accepted), list(rejected))
