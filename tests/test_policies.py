"""Tables for the pure policies: tool_choice per turn, allowed tools, turn planning, routing, and
the status state machine."""

from __future__ import annotations

from typing import Any

import pytest

from antwort_grpc import pb
from antwort_grpc.engine import response_status as state
from antwort_grpc.engine import turn_rules as policy
from antwort_grpc.engine.outcomes import Completed, ExecuteTools, Incomplete, RequiresAction
from antwort_grpc.engine.tools import resolve_tools
from antwort_grpc.executors.base import FunctionExecutor
from antwort_grpc.providers.base import FinishReason
from tests.fakes import MockExecutor, echo
from tests.harness import function_tool

M = pb.ToolChoiceMode
S = pb.ResponseStatus

AUTO = pb.ToolChoice(mode=M.TOOL_CHOICE_MODE_AUTO)
NONE = pb.ToolChoice(mode=M.TOOL_CHOICE_MODE_NONE)
REQUIRED = pb.ToolChoice(mode=M.TOOL_CHOICE_MODE_REQUIRED)
FORCED = pb.ToolChoice(function=pb.NamedToolChoice(name="a"))
ALLOWED_AUTO = pb.ToolChoice(allowed_tools=pb.AllowedTools(mode=M.TOOL_CHOICE_MODE_AUTO, tool_names=["a"]))
ALLOWED_REQUIRED = pb.ToolChoice(allowed_tools=pb.AllowedTools(mode=M.TOOL_CHOICE_MODE_REQUIRED, tool_names=["a"]))


@pytest.mark.parametrize(
    ("choice", "turn", "expected"),
    [
        (None, 1, None),
        (None, 2, None),
        (AUTO, 1, AUTO),
        (AUTO, 3, AUTO),
        (NONE, 1, NONE),
        (NONE, 2, NONE),
        (REQUIRED, 1, REQUIRED),
        (REQUIRED, 2, None),
        (FORCED, 1, FORCED),
        (FORCED, 2, None),
        (ALLOWED_AUTO, 1, ALLOWED_AUTO),
        (ALLOWED_AUTO, 2, ALLOWED_AUTO),
        (ALLOWED_REQUIRED, 1, ALLOWED_REQUIRED),
        (ALLOWED_REQUIRED, 2, ALLOWED_AUTO),
    ],
)
def test_tool_choice_per_turn(choice: pb.ToolChoice | None, turn: int, expected: pb.ToolChoice | None) -> None:
    assert policy.turn_tool_choice(choice, turn) == expected


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (None, None),
        (AUTO, None),
        (ALLOWED_AUTO, frozenset({"a"})),
        (pb.ToolChoice(allowed_tools=pb.AllowedTools()), None),
    ],
)
def test_allowed_names(choice: pb.ToolChoice | None, expected: frozenset[str] | None) -> None:
    assert policy.allowed_names(choice) == expected


def call(name: str, call_id: str = "") -> pb.FunctionCall:
    return pb.FunctionCall(call_id=call_id or f"id_{name}", name=name, arguments="{}")


KNOWN = frozenset({"srv", "cli", "other"})


def plan_turn(*, server_side: frozenset[str], **screen: Any) -> object:
    """Where a turn goes when no call needs approval, as the engine decides it: its calls screened
    (engine/turn.py), then routed to executors or the client (engine/tool_turn.py)."""
    screened = policy.screen_turn(**screen)
    if isinstance(screened, policy.Screened):
        return policy.route_calls(screened.accepted, screened.rejected, server_side)
    return screened


@pytest.mark.parametrize(
    ("case", "finish", "calls", "choice", "loop", "expected"),
    [
        ("final answer", FinishReason.STOP, [], None, True, Completed()),
        ("length", FinishReason.LENGTH, [call("srv")], None, True, Incomplete("max_output_tokens")),
        ("content filter", FinishReason.CONTENT_FILTER, [], None, True, Incomplete("content_filter")),
        ("single-shot", FinishReason.TOOL_CALLS, [call("cli")], None, False, Completed()),
        ("choice none", FinishReason.TOOL_CALLS, [call("srv")], NONE, True, Completed()),
        ("server call", FinishReason.TOOL_CALLS, [call("srv")], None, True, ExecuteTools([call("srv")], [])),
        ("client call", FinishReason.TOOL_CALLS, [call("cli")], None, True, RequiresAction([call("cli")], [])),
        (
            "mixed turn pauses",
            FinishReason.TOOL_CALLS,
            [call("srv"), call("cli")],
            None,
            True,
            RequiresAction([call("cli")], []),
        ),
        (
            "unknown tool",
            FinishReason.TOOL_CALLS,
            [call("ghost")],
            None,
            True,
            ExecuteTools(
                [],
                [
                    pb.FunctionCallOutput(
                        call_id="id_ghost", output="tool 'ghost' is not defined in this request", is_error=True
                    )
                ],
            ),
        ),
    ],
)
def test_plan_turn(
    case: str,
    finish: FinishReason,
    calls: list[pb.FunctionCall],
    choice: pb.ToolChoice | None,
    loop: bool,
    expected: object,
) -> None:
    outcome = plan_turn(
        finish=finish, calls=calls, choice=choice, loop_enabled=loop, server_side=frozenset({"srv"}), known=KNOWN
    )
    assert outcome == expected, case


def test_plan_turn_rejects_calls_outside_allowed_tools_for_both_kinds() -> None:
    allowed = pb.ToolChoice(allowed_tools=pb.AllowedTools(tool_names=["other"]))
    outcome = plan_turn(
        finish=FinishReason.TOOL_CALLS,
        calls=[call("srv"), call("cli")],
        choice=allowed,
        loop_enabled=True,
        server_side=frozenset({"srv"}),
        known=KNOWN,
    )
    assert isinstance(outcome, ExecuteTools)
    assert outcome.calls == []
    assert [r.call_id for r in outcome.rejected] == ["id_srv", "id_cli"]
    assert all(r.is_error and "not allowed" in r.output for r in outcome.rejected)


async def test_routing_a_call_to_an_executor() -> None:
    sandbox = MockExecutor({"run_code": echo})
    mcp = MockExecutor({"search": echo, "run_code": echo}, tool_kind=pb.ToolKind.TOOL_KIND_MCP)
    tools = [function_tool(n) for n in ("run_code", "search", "client_only")]
    cases = [
        ([], {"run_code": None, "search": None, "client_only": None}),
        ([FunctionExecutor()], {"run_code": None, "search": None, "client_only": None}),
        ([sandbox], {"run_code": sandbox, "search": None, "client_only": None}),
        ([sandbox, mcp], {"run_code": sandbox, "search": mcp, "client_only": None}),
        ([mcp, sandbox], {"run_code": mcp, "search": mcp, "client_only": None}),
    ]
    for executors, expected in cases:
        toolset = await resolve_tools(tools, executors)
        assert {name: route.executor for name, route in toolset.routes.items()} == expected
        assert [f.name for f in toolset.functions] == ["run_code", "search", "client_only"]


TERMINAL = [
    S.RESPONSE_STATUS_COMPLETED,
    S.RESPONSE_STATUS_INCOMPLETE,
    S.RESPONSE_STATUS_FAILED,
    S.RESPONSE_STATUS_CANCELLED,
    S.RESPONSE_STATUS_REQUIRES_ACTION,
]


@pytest.mark.parametrize(
    ("current", "new", "allowed"),
    [
        (S.RESPONSE_STATUS_UNSPECIFIED, S.RESPONSE_STATUS_QUEUED, True),
        (S.RESPONSE_STATUS_UNSPECIFIED, S.RESPONSE_STATUS_IN_PROGRESS, True),
        (S.RESPONSE_STATUS_QUEUED, S.RESPONSE_STATUS_IN_PROGRESS, True),
        (S.RESPONSE_STATUS_QUEUED, S.RESPONSE_STATUS_COMPLETED, False),
        *[(S.RESPONSE_STATUS_IN_PROGRESS, t, True) for t in TERMINAL],
        (S.RESPONSE_STATUS_IN_PROGRESS, S.RESPONSE_STATUS_QUEUED, False),
        *[(t, n, False) for t in TERMINAL for n in [*TERMINAL, S.RESPONSE_STATUS_IN_PROGRESS]],
    ],
)
def test_status_state_machine(current: int, new: int, allowed: bool) -> None:
    assert state.can_transition(current, new) is allowed
    if allowed:
        assert state.transition(current, new) == new
    else:
        with pytest.raises(state.InvalidTransition):
            state.transition(current, new)
