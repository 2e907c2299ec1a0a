"""The executor contract, the in-process twin of antwort.v1.ToolExecutorService.

A call is a `pb.FunctionCall` and its result a `pb.FunctionCallOutput`: the thin ToolCall and
ToolResult of the data model are the protobuf items themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Protocol, runtime_checkable

from antwort_grpc import pb

# A plain int: a protobuf enum attribute lookup is a Python-level call, made per request.
_FUNCTION: int = pb.ToolKind.TOOL_KIND_FUNCTION

# Executors report progress of a running call as short text messages.
ProgressSink = Callable[[str], None]

# The deadline of the request a call belongs to, in event-loop time (loop.time()), or None.
# Set by the engine around tool execution; remote executors pass what remains of it on.
current_deadline: ContextVar[float | None] = ContextVar("current_deadline", default=None)


class ToolExecutor(Protocol):
    @property
    def kind(self) -> int: ...

    async def can_execute(self, tool: pb.Tool) -> bool:
        """Whether this executor runs calls of the given tool definition."""
        ...

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: ProgressSink) -> pb.FunctionCallOutput:
        """Run one call. Failures are returned as is_error outputs; raising is also tolerated
        (the engine turns the exception into an is_error output)."""
        ...


@runtime_checkable
class HostedToolSource(Protocol):
    """An executor whose hosted tools (an MCP server, code_interpreter) a request asks for by a
    non-function Tool; this says which function definitions the model sees for it."""

    async def functions_for(self, tool: pb.Tool) -> list[pb.FunctionTool]: ...


@runtime_checkable
class ToolTimeoutSource(Protocol):
    """An executor that advertises a default timeout per tool (seconds, or None for none)."""

    def tool_timeout(self, name: str) -> float | None: ...


class FunctionExecutor:
    """Client-executed function tools: never runs anything, it marks calls for the client.

    Registered, it turns the engine from single-shot into the agentic loop for function tools:
    their calls end the response with REQUIRES_ACTION.
    """

    @property
    def kind(self) -> int:
        return _FUNCTION

    async def can_execute(self, tool: pb.Tool) -> bool:
        return bool(tool.WhichOneof("kind") == "function")

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: ProgressSink) -> pb.FunctionCallOutput:
        raise RuntimeError("function tools are executed by the client")
