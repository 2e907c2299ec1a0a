"""In-process executors for tests of the loop (the real remote executors have their own tests)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from antwort_grpc import pb
from antwort_grpc.executors.base import ProgressSink

Handler = Callable[[pb.FunctionCall], str]


@dataclass
class MockExecutor:
    """A server-side executor that claims the function tools named in `handlers`."""

    handlers: dict[str, Handler]
    delay: float = 0.0
    tool_kind: int = pb.ToolKind.TOOL_KIND_SANDBOX
    progress_messages: list[str] = field(default_factory=list)
    calls: list[pb.FunctionCall] = field(default_factory=list)
    running: int = 0
    max_running: int = 0
    started: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def kind(self) -> int:
        return self.tool_kind

    async def can_execute(self, tool: pb.Tool) -> bool:
        return tool.WhichOneof("kind") == "function" and tool.function.name in self.handlers

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: ProgressSink) -> pb.FunctionCallOutput:
        self.calls.append(call)
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        self.started.set()
        try:
            for message in self.progress_messages:
                progress(message)
            if self.delay:
                await asyncio.sleep(self.delay)
            output = self.handlers[call.name](call)
            return pb.FunctionCallOutput(call_id=call.call_id, output=output)
        finally:
            self.running -= 1


def echo(call: pb.FunctionCall) -> str:
    return json.dumps({"tool": call.name, "arguments": json.loads(call.arguments or "{}")})


def fails(call: pb.FunctionCall) -> str:
    raise RuntimeError(f"{call.name} exploded")


def front_of(responses: Any) -> Any:
    """The core's front around a responses layer, with a neutral edge (for servicer unit tests)."""
    from antwort_grpc.edge import Edge
    from antwort_grpc.front import Front

    return Front(responses, Edge())


async def raw_converse(messages: Any) -> Any:
    """Converse messages as the gRPC door hands them to the core: undecoded, a create marked."""
    from antwort_grpc import pb
    from antwort_grpc.server.decode import RawRequest

    async for message in messages:
        yield RawRequest(message.SerializeToString(), pb.ConverseRequest.FromString, message.HasField("create"))
