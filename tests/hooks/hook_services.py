"""Hooks for the tests, run in-process or as their own process
(`antwort-grpc hook run tests.hooks.hook_services:Recorder`).

A process tells the test what it saw through a JSON-lines file named by HOOK_RECORD.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from antwort_grpc import pb
from antwort_grpc.hooks import PolicyHook, current_caller


def record(point: str, **fields: Any) -> None:
    path = os.environ.get("HOOK_RECORD")
    if not path:
        return
    caller = current_caller.get()
    line = {"point": point, "traceparent": caller.traceparent, "owner": caller.owner, **fields}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def read_record(path: str) -> list[dict[str, Any]]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


class Recorder(PolicyHook):
    """Wants every point, changes nothing, records each call."""

    name = "recorder"

    async def before_response(self, request: pb.BeforeResponseRequest) -> pb.BeforeResponseResponse:
        record("before_response", response_id=request.context.response_id)
        return pb.BeforeResponseResponse()

    async def after_response(self, request: pb.AfterResponseRequest) -> pb.AfterResponseResponse:
        status = pb.ResponseStatus.Name(request.response.status)
        record("after_response", status=status, response_id=request.response.id)
        return pb.AfterResponseResponse()

    async def before_model(self, request: pb.BeforeModelRequest) -> pb.BeforeModelResponse:
        record("before_model", turn=request.context.turn, items=len(request.call.items))
        return pb.BeforeModelResponse()

    async def after_model(self, request: pb.AfterModelRequest) -> pb.AfterModelResponse:
        record("after_model", turn=request.context.turn, output=len(request.output))
        return pb.AfterModelResponse()

    async def before_tool(self, request: pb.BeforeToolRequest) -> pb.BeforeToolResponse:
        record("before_tool", call=request.call.name, arguments=request.call.arguments)
        return pb.BeforeToolResponse()

    async def after_tool(self, request: pb.AfterToolRequest) -> pb.AfterToolResponse:
        record("after_tool", call=request.call.name, output=request.result.output)
        return pb.AfterToolResponse()

    async def approve_tool(self, request: pb.ApproveToolRequest) -> pb.ApproveToolResponse:
        record("approve_tool", call=request.call.name)
        return pb.ApproveToolResponse()

    async def pause_check(self, request: pb.PauseCheckRequest) -> pb.PauseCheckResponse:
        at = pb.PauseCheckRequest.CheckPoint.Name(request.check_point)
        record("pause_check", turn=request.context.turn, at=at)
        return pb.PauseCheckResponse()


class Hangs(PolicyHook):
    """Never answers before a tool call or a model call."""

    name = "hangs"

    async def before_tool(self, request: pb.BeforeToolRequest) -> pb.BeforeToolResponse:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def before_model(self, request: pb.BeforeModelRequest) -> pb.BeforeModelResponse:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class Crashes(PolicyHook):
    name = "crashes"

    async def before_tool(self, request: pb.BeforeToolRequest) -> pb.BeforeToolResponse:
        raise RuntimeError("the rules file is gone")

    async def before_model(self, request: pb.BeforeModelRequest) -> pb.BeforeModelResponse:
        raise RuntimeError("the rules file is gone")


class Garbage(PolicyHook):
    """Answers that cannot be applied: arguments that are not JSON, tools the request lacks."""

    name = "garbage"

    async def before_tool(self, request: pb.BeforeToolRequest) -> pb.BeforeToolResponse:
        return pb.BeforeToolResponse(arguments="{not json")

    async def before_model(self, request: pb.BeforeModelRequest) -> pb.BeforeModelResponse:
        change = pb.ModelCallChange(offered_tools=pb.OfferedTools(names=["no_such_tool"]))
        return pb.BeforeModelResponse(change=change)


class Rewrites(PolicyHook):
    """Changes what it may: the model call's instructions and temperature, an appended developer
    note, numbers in tool arguments (doubled), results (bracketed)."""

    name = "rewrites"

    async def before_model(self, request: pb.BeforeModelRequest) -> pb.BeforeModelResponse:
        note = pb.Item(
            message=pb.Message(
                role=pb.Role.ROLE_DEVELOPER, content=[pb.ContentPart(input_text=pb.InputText(text="be careful"))]
            )
        )
        change = pb.ModelCallChange(
            instructions=request.call.instructions + " (checked)", temperature=0.25, append_items=[note]
        )
        return pb.BeforeModelResponse(change=change)

    async def before_tool(self, request: pb.BeforeToolRequest) -> pb.BeforeToolResponse:
        args = json.loads(request.call.arguments)
        doubled = {k: v * 2 if isinstance(v, int | float) else v for k, v in args.items()}
        return pb.BeforeToolResponse(arguments=json.dumps(doubled))

    async def after_tool(self, request: pb.AfterToolRequest) -> pb.AfterToolResponse:
        result = pb.FunctionCallOutput(output=f"[{request.result.output}]", is_error=request.result.is_error)
        return pb.AfterToolResponse(result=result)


class Answers(PolicyHook):
    """Answers every model call itself."""

    name = "answers"

    async def before_model(self, request: pb.BeforeModelRequest) -> pb.BeforeModelResponse:
        text = pb.ContentPart(output_text=pb.OutputText(text="cached answer"))
        answer = pb.ModelAnswer(output=[pb.Item(message=pb.Message(content=[text]))])
        return pb.BeforeModelResponse(answer=answer)


class Rejects(PolicyHook):
    """Refuses requests whose metadata says tier=free; gives every other request a model."""

    name = "rejects"

    async def before_response(self, request: pb.BeforeResponseRequest) -> pb.BeforeResponseResponse:
        if request.request.metadata.get("tier") == "free":
            return pb.BeforeResponseResponse(reject_reason="no budget left")
        changed = pb.CreateResponseRequest()
        changed.CopyFrom(request.request)
        changed.instructions = "Answer in French."
        return pb.BeforeResponseResponse(request=changed)


class Pauses(PolicyHook):
    """Pauses before the second turn."""

    name = "pauses"

    async def pause_check(self, request: pb.PauseCheckRequest) -> pb.PauseCheckResponse:
        boundary = request.check_point == pb.PauseCheckRequest.CHECK_POINT_TURN_BOUNDARY
        return pb.PauseCheckResponse(pause=boundary and request.context.turn == 1, reason="review turn 1")


class Gatekeeper(PolicyHook):
    """Denies `rm`, approves everything else."""

    name = "gatekeeper"

    async def approve_tool(self, request: pb.ApproveToolRequest) -> pb.ApproveToolResponse:
        if request.call.name == "rm":
            return pb.ApproveToolResponse(decision=pb.ApproveToolResponse.DECISION_DENY, reason="destructive")
        return pb.ApproveToolResponse(decision=pb.ApproveToolResponse.DECISION_APPROVE, reason="fine")


class AuditDown(PolicyHook):
    """An audit hook whose log is gone."""

    name = "audit-down"

    async def after_response(self, request: pb.AfterResponseRequest) -> pb.AfterResponseResponse:
        raise RuntimeError("audit log unavailable")


class ToolOnlyCrash(PolicyHook):
    name = "tool-only-crash"

    async def before_tool(self, request: pb.BeforeToolRequest) -> pb.BeforeToolResponse:
        raise RuntimeError("policy engine down")
