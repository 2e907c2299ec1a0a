"""Which tools a request offers the model, and which executor runs each of them."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from antwort_grpc import pb
from antwort_grpc.errors import FieldViolation, RequestError
from antwort_grpc.executors.base import HostedToolSource, ToolExecutor


@dataclass(frozen=True, slots=True)
class Route:
    # The request's tool definition the name came from (a function, or a hosted tool).
    tool: pb.Tool
    # None: the client executes it.
    executor: ToolExecutor | None


@dataclass(slots=True)
class ToolSet:
    functions: list[pb.FunctionTool] = field(default_factory=list)
    routes: dict[str, Route] = field(default_factory=dict)

    @property
    def server_side(self) -> frozenset[str]:
        return frozenset(name for name, r in self.routes.items() if r.executor is not None)


# How many tools of one request are looked up (CanExecute on remote executors) at once.
LOOKUP_CONCURRENCY = 16


# A plain int: a protobuf enum attribute lookup is a Python-level call, made per request here.
CLIENT: int = pb.ToolKind.TOOL_KIND_FUNCTION


def is_server_side(executor: ToolExecutor) -> bool:
    return bool(executor.kind != CLIENT)


async def resolve_tools(tools: Sequence[pb.Tool], executors: Sequence[ToolExecutor]) -> ToolSet:
    """Route every tool of a request: a function runs on the first server-side executor that
    claims it, else on the client; a hosted tool (MCP server, code interpreter) expands into the
    functions its executor offers. Only tools the request names are ever offered."""
    result = ToolSet()
    owners = await _owners(tools, [e for e in executors if is_server_side(e)])
    for position, (tool, owner) in enumerate(zip(tools, owners, strict=True)):
        if tool.WhichOneof("kind") == "function":
            result.routes[tool.function.name] = Route(tool, owner)
            result.functions.append(tool.function)
            continue
        if owner is None:
            raise RequestError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"no tool executor serves {_describe(tool)}",
                [FieldViolation(f"tools[{position}]", f"no tool executor serves {_describe(tool)}")],
                "tool_unavailable",
            )
        assert isinstance(owner, HostedToolSource)
        for function in await owner.functions_for(tool):
            if function.name in result.routes:
                raise RequestError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"tool name {function.name!r} is offered twice",
                    [FieldViolation(f"tools[{position}]", f"tool name {function.name!r} is offered twice")],
                    "invalid_request",
                )
            result.routes[function.name] = Route(tool, owner)
            result.functions.append(function)
    return result


async def _owners(tools: Sequence[pb.Tool], servers: Sequence[ToolExecutor]) -> list[ToolExecutor | None]:
    """For each tool, in order, the first server-side executor that claims it (a hosted tool: the
    first that is also a HostedToolSource). Tools are looked up concurrently, up to
    LOOKUP_CONCURRENCY at once: with remote executors each lookup may be a CanExecute round trip."""
    if not servers or not tools:
        return [None] * len(tools)
    limit = asyncio.Semaphore(LOOKUP_CONCURRENCY)

    async def owner(tool: pb.Tool) -> ToolExecutor | None:
        function = tool.WhichOneof("kind") == "function"
        async with limit:
            for executor in servers:
                if (function or isinstance(executor, HostedToolSource)) and await executor.can_execute(tool):
                    return executor
        return None

    if len(tools) == 1:
        return [await owner(tools[0])]
    async with asyncio.TaskGroup() as group:
        lookups = [group.create_task(owner(tool)) for tool in tools]
    return [lookup.result() for lookup in lookups]


def _describe(tool: pb.Tool) -> str:
    if tool.WhichOneof("kind") == "mcp":
        return f"MCP server {tool.mcp.server_label!r}"
    return str(tool.WhichOneof("kind"))
