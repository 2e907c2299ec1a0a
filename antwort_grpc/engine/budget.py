"""The budget of a response: its execution limits (turns, tool calls, wall time, output tokens),
tool timeouts and the context window's limits — what applies to one response, from its request
and the server's maximums, and whether a step is still within them. Pure: no I/O, tested with
tables. Each limit has one source: the server's maximum, lowered by the request."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

from google.protobuf.duration_pb2 import Duration

from antwort_grpc import pb
from antwort_grpc.engine.window import WindowLimits


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """The server's maximums (None: no maximum). A request may ask for less, never for more."""

    max_turns: int = 10
    max_tool_calls: int | None = None
    # Seconds.
    max_duration: float | None = None
    max_output_tokens: int | None = None
    # The longest a tool timeout may be (the remote executor's call timeout bounds every call).
    max_tool_timeout: float = 300.0
    # The context the model is sent with truncation AUTO.
    context_max_items: int | None = None
    context_max_tokens: int | None = None

    @property
    def context(self) -> WindowLimits:
        return WindowLimits(self.context_max_items, self.context_max_tokens)


@dataclass(frozen=True, slots=True)
class ControlLimits:
    """What controls may add to one response: items per control, steering messages and follow-ups
    waiting to be taken in (count and bytes each), and the bytes the response may hold in all with
    what they add (its input and output: the history cap, so that it can be read and continued)."""

    max_items: int = 64
    max_steers: int = 16
    max_steer_bytes: int = 4 * 1024 * 1024
    max_follow_ups: int = 16
    max_follow_up_bytes: int = 4 * 1024 * 1024
    max_response_bytes: int = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class RunLimits:
    """The limits of one response."""

    max_turns: int
    max_tool_calls: int | None = None
    max_duration: float | None = None
    max_output_tokens: int | None = None


def seconds(duration: Duration) -> float:
    return duration.seconds + duration.nanos / 1e9


def run_limits(request: pb.CreateResponseRequest, server: ServerLimits) -> RunLimits:
    """The request's limits where it sets them, else the server's (validation keeps them within)."""
    if not request.HasField("limits"):
        return server_defaults(server)
    asked = request.limits
    return RunLimits(
        max_turns=asked.max_turns if asked.HasField("max_turns") else server.max_turns,
        max_tool_calls=asked.max_tool_calls if asked.HasField("max_tool_calls") else server.max_tool_calls,
        max_duration=seconds(asked.max_duration) if asked.HasField("max_duration") else server.max_duration,
        max_output_tokens=asked.max_output_tokens if asked.HasField("max_output_tokens") else server.max_output_tokens,
    )


@functools.lru_cache(maxsize=8)
def server_defaults(server: ServerLimits) -> RunLimits:
    """The limits of a request that sets none: one shared value per server."""
    return RunLimits(server.max_turns, server.max_tool_calls, server.max_duration, server.max_output_tokens)


def limit_reached(limits: RunLimits, turns_done: int, output_tokens: int) -> str | None:
    """At a turn boundary: the limit that ends the response before another turn, if any."""
    if turns_done >= limits.max_turns:
        return "max_turns"
    if output_tokens_spent(limits, output_tokens):
        return "max_output_tokens"
    return None


def tool_calls_exceed(limits: RunLimits, done: int, planned: int) -> bool:
    """Whether running `planned` more calls would go past the response's tool call limit."""
    return limits.max_tool_calls is not None and done + planned > limits.max_tool_calls


def output_budget(limits: RunLimits, per_call: int | None, used: int) -> int | None:
    """The max_output_tokens of the next model call: the per-call limit, lowered to what the
    response has left."""
    if limits.max_output_tokens is None:
        return per_call
    left = max(limits.max_output_tokens - used, 0)
    return left if per_call is None else min(per_call, left)


def output_tokens_spent(limits: RunLimits, used: int) -> bool:
    return limits.max_output_tokens is not None and used >= limits.max_output_tokens


def tool_timeout(
    name: str,
    advertised: float | None,
    request_default: float | None,
    overrides: Mapping[str, float],
) -> float | None:
    """Seconds one call of `name` may take, most specific first: the request's override for the
    tool, the request's timeout for every tool, the executor's default for the tool; else None."""
    if name in overrides:
        return overrides[name]
    if request_default is not None:
        return request_default
    return advertised


@dataclass(frozen=True, slots=True)
class ToolTimeouts:
    """A request's tool timeouts, read once per response."""

    default: float | None
    overrides: Mapping[str, float]

    @classmethod
    def of(cls, request: pb.CreateResponseRequest) -> ToolTimeouts:
        default = seconds(request.tool_timeout) if request.HasField("tool_timeout") else None
        return cls(default, {name: seconds(d) for name, d in request.tool_timeouts.items()})

    def for_tool(self, name: str, advertised: float | None) -> float | None:
        return tool_timeout(name, advertised, self.default, self.overrides)
