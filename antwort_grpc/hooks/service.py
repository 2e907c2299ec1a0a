"""Write a hook: subclass `PolicyHook` and override the points you want.

The same class runs in the gateway's process (`--hook module:Class`) or as a HookService of its
own (`antwort-grpc hook run module:Class --listen host:port`, then `--hook host:port`). The
requests and answers are the antwort.v1.HookService messages; an empty answer means "no objection,
no change". The points a hook is called at are the methods it overrides.

    class NoShell(PolicyHook):
        name = "no-shell"

        async def before_tool(self, request: pb.BeforeToolRequest) -> pb.BeforeToolResponse:
            if request.call.name == "run_shell":
                return pb.BeforeToolResponse(deny_reason="shell access is not allowed")
            return pb.BeforeToolResponse()
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from antwort_grpc import pb


class Point:
    """The HookPoint values as plain ints: the protobuf enum's attribute lookup is slow, and these
    are read on every turn."""

    HOOK_POINT_BEFORE_RESPONSE = int(pb.HookPoint.HOOK_POINT_BEFORE_RESPONSE)
    HOOK_POINT_AFTER_RESPONSE = int(pb.HookPoint.HOOK_POINT_AFTER_RESPONSE)
    HOOK_POINT_BEFORE_MODEL = int(pb.HookPoint.HOOK_POINT_BEFORE_MODEL)
    HOOK_POINT_AFTER_MODEL = int(pb.HookPoint.HOOK_POINT_AFTER_MODEL)
    HOOK_POINT_BEFORE_TOOL = int(pb.HookPoint.HOOK_POINT_BEFORE_TOOL)
    HOOK_POINT_AFTER_TOOL = int(pb.HookPoint.HOOK_POINT_AFTER_TOOL)
    HOOK_POINT_APPROVE_TOOL = int(pb.HookPoint.HOOK_POINT_APPROVE_TOOL)
    HOOK_POINT_PAUSE_CHECK = int(pb.HookPoint.HOOK_POINT_PAUSE_CHECK)


P = Point


@dataclass(frozen=True, slots=True)
class PointSpec:
    """How one point is called: the PolicyHook method (also the point's field in a Session's
    HookCall and HookAnswer), the HookService RPC, the request and answer types."""

    method: str
    rpc: str
    request: type[Message]
    reply: type[Message]


POINTS: dict[int, PointSpec] = {
    P.HOOK_POINT_BEFORE_RESPONSE: PointSpec(
        "before_response", "BeforeResponse", pb.BeforeResponseRequest, pb.BeforeResponseResponse
    ),
    P.HOOK_POINT_AFTER_RESPONSE: PointSpec(
        "after_response", "AfterResponse", pb.AfterResponseRequest, pb.AfterResponseResponse
    ),
    P.HOOK_POINT_BEFORE_MODEL: PointSpec("before_model", "BeforeModel", pb.BeforeModelRequest, pb.BeforeModelResponse),
    P.HOOK_POINT_AFTER_MODEL: PointSpec("after_model", "AfterModel", pb.AfterModelRequest, pb.AfterModelResponse),
    P.HOOK_POINT_BEFORE_TOOL: PointSpec("before_tool", "BeforeTool", pb.BeforeToolRequest, pb.BeforeToolResponse),
    P.HOOK_POINT_AFTER_TOOL: PointSpec("after_tool", "AfterTool", pb.AfterToolRequest, pb.AfterToolResponse),
    P.HOOK_POINT_APPROVE_TOOL: PointSpec("approve_tool", "ApproveTool", pb.ApproveToolRequest, pb.ApproveToolResponse),
    P.HOOK_POINT_PAUSE_CHECK: PointSpec("pause_check", "PauseCheck", pb.PauseCheckRequest, pb.PauseCheckResponse),
}
# One message may carry a whole request and a whole context (each up to tens of MiB).
MAX_MESSAGE_BYTES = 128 * 1024 * 1024
# The point of a request, by its type.
POINT_OF: dict[type[Message], int] = {spec.request: point for point, spec in POINTS.items()}


def point_name(point: int) -> str:
    """ "before_tool" for HOOK_POINT_BEFORE_TOOL."""
    spec = POINTS.get(point)
    return spec.method if spec else f"point {point}"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a hook call is for: sent as metadata to remote hooks (`traceparent`, `tracestate`,
    `antwort-owner`); `current_caller.get()` inside a hook method."""

    owner: str = ""
    traceparent: str = ""
    tracestate: str = ""

    def metadata(self) -> tuple[tuple[str, str], ...]:
        pairs = (("traceparent", self.traceparent), ("tracestate", self.tracestate), ("antwort-owner", self.owner))
        return tuple((k, v) for k, v in pairs if v)

    @classmethod
    def from_metadata(cls, metadata: Iterable[tuple[str, str | bytes]]) -> Caller:
        found = {k: v for k, v in metadata if isinstance(v, str)}
        return cls(found.get("antwort-owner", ""), found.get("traceparent", ""), found.get("tracestate", ""))


# Caller is frozen: one shared default is safe.
current_caller: ContextVar[Caller] = ContextVar("current_caller", default=Caller())  # noqa: B039


class PolicyHook:
    """One hook. Override the points you want; the rest are never called."""

    name: str = "hook"

    async def before_response(self, request: pb.BeforeResponseRequest) -> pb.BeforeResponseResponse:
        return pb.BeforeResponseResponse()

    async def after_response(self, request: pb.AfterResponseRequest) -> pb.AfterResponseResponse:
        return pb.AfterResponseResponse()

    async def before_model(self, request: pb.BeforeModelRequest) -> pb.BeforeModelResponse:
        return pb.BeforeModelResponse()

    async def after_model(self, request: pb.AfterModelRequest) -> pb.AfterModelResponse:
        return pb.AfterModelResponse()

    async def before_tool(self, request: pb.BeforeToolRequest) -> pb.BeforeToolResponse:
        return pb.BeforeToolResponse()

    async def after_tool(self, request: pb.AfterToolRequest) -> pb.AfterToolResponse:
        return pb.AfterToolResponse()

    async def approve_tool(self, request: pb.ApproveToolRequest) -> pb.ApproveToolResponse:
        return pb.ApproveToolResponse()

    async def pause_check(self, request: pb.PauseCheckRequest) -> pb.PauseCheckResponse:
        return pb.PauseCheckResponse()

    def points(self) -> frozenset[int]:
        """The points whose method this class overrides."""
        cls = type(self)
        return frozenset(
            point for point, spec in POINTS.items() if getattr(cls, spec.method) is not getattr(PolicyHook, spec.method)
        )

    async def start(self) -> None:
        """Called once before the first call (connect, load rules)."""

    async def close(self) -> None:
        """Called once at shutdown."""

    async def call(self, point: int, request: Any) -> Message:
        """Dispatch one point's request to its method."""
        reply: Message = await getattr(self, POINTS[point].method)(request)
        return reply


@dataclass(slots=True)
class Exchange:
    """What a hook answered to calls asked together: the answers of the calls it evaluated, in
    order, and when the call after the last answer failed, why."""

    answers: list[Message]
    error: str = ""


async def evaluate(hook: PolicyHook, calls: Sequence[Message]) -> Exchange:
    """Calls asked together, the way a Session exchange is answered: one after another, stopping
    after the first answer that is not empty (the asker applies it and asks again for the rest)
    or at the first call that fails."""
    answers: list[Message] = []
    for request in calls:
        try:
            reply = await hook.call(POINT_OF[type(request)], request)
        except Exception as err:
            return Exchange(answers, f"{type(err).__name__}: {err}")
        answers.append(reply)
        if not isinstance(reply, Message) or reply.ByteSize():
            break
    return Exchange(answers)
