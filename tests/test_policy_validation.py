"""Validation of the policy fields of a request (limits, tool timeouts, failure mode, truncation)
against the server's maximums: a table of bad requests, each with the field it names."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from google.protobuf.duration_pb2 import Duration

from antwort_grpc import pb
from antwort_grpc.engine.budget import (
    RunLimits,
    ServerLimits,
    output_budget,
    run_limits,
    tool_calls_exceed,
    tool_timeout,
)
from antwort_grpc.responses.validation import validate_policy

SERVER = ServerLimits(max_turns=10, max_tool_calls=50, max_duration=600, max_output_tokens=10_000, max_tool_timeout=300)


def request(edit: Callable[[pb.CreateResponseRequest], object]) -> pb.CreateResponseRequest:
    r = pb.CreateResponseRequest(input_text="hi")
    edit(r)
    return r


BAD: list[tuple[str, Callable[[pb.CreateResponseRequest], object], str]] = [
    ("zero turns", lambda r: setattr(r.limits, "max_turns", 0), "limits.max_turns"),
    ("negative turns", lambda r: setattr(r.limits, "max_turns", -3), "limits.max_turns"),
    ("turns above the server's maximum", lambda r: setattr(r.limits, "max_turns", 11), "limits.max_turns"),
    ("negative tool calls", lambda r: setattr(r.limits, "max_tool_calls", -1), "limits.max_tool_calls"),
    ("tool calls above the maximum", lambda r: setattr(r.limits, "max_tool_calls", 51), "limits.max_tool_calls"),
    ("zero output tokens", lambda r: setattr(r.limits, "max_output_tokens", 0), "limits.max_output_tokens"),
    (
        "output tokens above the max",
        lambda r: setattr(r.limits, "max_output_tokens", 10_001),
        "limits.max_output_tokens",
    ),
    ("negative duration", lambda r: r.limits.max_duration.CopyFrom(Duration(seconds=-5)), "limits.max_duration"),
    ("zero duration", lambda r: r.limits.max_duration.CopyFrom(Duration()), "limits.max_duration"),
    ("duration above the max", lambda r: r.limits.max_duration.CopyFrom(Duration(seconds=601)), "limits.max_duration"),
    ("broken duration", lambda r: r.limits.max_duration.CopyFrom(Duration(seconds=1, nanos=-5)), "limits.max_duration"),
    ("negative tool timeout", lambda r: r.tool_timeout.CopyFrom(Duration(seconds=-1)), "tool_timeout"),
    ("absurd tool timeout", lambda r: r.tool_timeout.CopyFrom(Duration(seconds=10**9)), "tool_timeout"),
    ("zero per-tool timeout", lambda r: r.tool_timeouts["add"].CopyFrom(Duration()), "tool_timeouts[add]"),
    (
        "per-tool timeout of a bad name",
        lambda r: r.tool_timeouts["no such"].CopyFrom(Duration(seconds=1)),
        "tool_timeouts[no such]",
    ),
    ("unknown failure mode", lambda r: setattr(r, "tool_failure_mode", 7), "tool_failure_mode"),
    ("unknown truncation", lambda r: setattr(r, "truncation", 9), "truncation"),
]


@pytest.mark.parametrize(("edit", "field"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_policy_field_is_a_violation_of_that_field(
    edit: Callable[[pb.CreateResponseRequest], object], field: str
) -> None:
    violations = validate_policy(request(edit), SERVER)
    assert [v.field for v in violations] == [field]


def test_limits_within_the_servers_maximums_are_accepted() -> None:
    def edit(r: pb.CreateResponseRequest) -> None:
        r.limits.max_turns = 10
        r.limits.max_tool_calls = 0
        r.limits.max_output_tokens = 10_000
        r.limits.max_duration.CopyFrom(Duration(seconds=600))
        r.tool_timeout.CopyFrom(Duration(nanos=500_000_000))
        r.tool_timeouts["add"].CopyFrom(Duration(seconds=300))
        r.tool_failure_mode = pb.ToolFailureMode.TOOL_FAILURE_MODE_FAIL
        r.truncation = pb.Truncation.TRUNCATION_AUTO

    assert validate_policy(request(edit), SERVER) == []


def test_without_a_server_maximum_a_day_is_the_longest_duration() -> None:
    unbounded = ServerLimits(max_duration=None)
    day = request(lambda r: r.limits.max_duration.CopyFrom(Duration(seconds=86_400)))
    assert validate_policy(day, unbounded) == []
    longer = request(lambda r: r.limits.max_duration.CopyFrom(Duration(seconds=86_401)))
    assert [v.field for v in validate_policy(longer, unbounded)] == ["limits.max_duration"]


def test_a_request_without_limits_gets_the_servers() -> None:
    assert run_limits(pb.CreateResponseRequest(), SERVER) == RunLimits(10, 50, 600.0, 10_000)
    asked = request(lambda r: (setattr(r.limits, "max_turns", 3), r.limits.max_duration.CopyFrom(Duration(seconds=2))))
    assert run_limits(asked, SERVER) == RunLimits(3, 50, 2.0, 10_000)


def test_tool_call_limit_counts_the_calls_about_to_run() -> None:
    limits = RunLimits(max_turns=10, max_tool_calls=3)
    assert not tool_calls_exceed(limits, done=1, planned=2)
    assert tool_calls_exceed(limits, done=2, planned=2)
    assert not tool_calls_exceed(RunLimits(max_turns=10), done=10**6, planned=5)


@pytest.mark.parametrize(
    ("total", "per_call", "used", "expected"),
    [
        (None, None, 500, None),
        (None, 100, 500, 100),
        (1000, None, 400, 600),
        (1000, 100, 400, 100),
        (1000, 100, 950, 50),
    ],
)
def test_each_model_call_gets_what_the_response_has_left(
    total: int | None, per_call: int | None, used: int, expected: int | None
) -> None:
    assert output_budget(RunLimits(max_turns=1, max_output_tokens=total), per_call, used) == expected


@pytest.mark.parametrize(
    ("advertised", "request_default", "overrides", "expected"),
    [
        (None, None, {}, None),
        (5.0, None, {}, 5.0),
        (5.0, 2.0, {}, 2.0),
        (5.0, 2.0, {"add": 0.5}, 0.5),
        (None, None, {"other": 0.5}, None),
    ],
)
def test_tool_timeout_takes_the_most_specific_setting(
    advertised: float | None, request_default: float | None, overrides: dict[str, float], expected: float | None
) -> None:
    assert tool_timeout("add", advertised, request_default, overrides) == expected
