"""A stop during a hook call that hangs ends the response at once, with its terminal event: every
wait of the run races its inbox, hook calls included. The hook service is a real gRPC server on a
loopback port whose hook never answers at one point, with a timeout far longer than a cancel waits
(CancelResponse answers with the response once it was stored as stopped, or as it is after 10 s)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from antwort_grpc import pb
from antwort_grpc.hooks import PolicyHook
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text
from tests.harness import final, kind
from tests.hooks.test_session import RecordingSession, gateway_with, hook_server, tools_request

S = pb.ResponseStatus


class _Hangs(PolicyHook):
    def __init__(self) -> None:
        self.asked = asyncio.Event()

    async def hang(self) -> None:
        self.asked.set()
        await asyncio.Event().wait()


class HangsBeforeModel(_Hangs):
    name = "hangs-before-model"

    async def before_model(self, request: pb.BeforeModelRequest) -> pb.BeforeModelResponse:
        await self.hang()
        raise AssertionError("unreachable")


class HangsApprovingTools(_Hangs):
    name = "hangs-approving-tools"

    async def approve_tool(self, request: pb.ApproveToolRequest) -> pb.ApproveToolResponse:
        await self.hang()
        raise AssertionError("unreachable")


class HangsBeforeTool(_Hangs):
    name = "hangs-before-tool"

    async def before_tool(self, request: pb.BeforeToolRequest) -> pb.BeforeToolResponse:
        await self.hang()
        raise AssertionError("unreachable")


class HangsAfterTool(_Hangs):
    name = "hangs-after-tool"

    async def after_tool(self, request: pb.AfterToolRequest) -> pb.AfterToolResponse:
        await self.hang()
        raise AssertionError("unreachable")


@pytest.mark.parametrize("session", [True, False], ids=["session", "unary"])
@pytest.mark.parametrize("hook", [HangsBeforeModel, HangsApprovingTools, HangsBeforeTool, HangsAfterTool])
async def test_a_cancel_during_a_hanging_hook_ends_the_response_at_once(hook: type[_Hangs], session: bool) -> None:
    hangs = hook()
    servicer = RecordingSession(hangs, session=session)
    provider = ScriptedProvider([[Call.of("lookup", {"q": "x"}, call_id="call_1")], [Text("Done.")]])
    async with (
        hook_server(servicer) as target,
        gateway_with(f"{target};timeout=60;failure=closed", provider) as gw,
    ):
        request = tools_request()
        request.stream = True
        call = gw.stub.CreateResponse(request)
        response_id = (await call.read()).event.created.response.id
        await hangs.asked.wait()
        cancelled = await gw.stub.CancelResponse(pb.CancelResponseRequest(response_id=response_id))
        events = []
        while (message := await call.read()) is not grpc.aio.EOF:
            events.append(message.event)
        stored = await gw.store.get(response_id)
    # Stored as cancelled within the cancel's wait: the hook's 60 s were not waited for.
    assert cancelled.response.status == S.RESPONSE_STATUS_CANCELLED
    assert kind(events[-1]) == "cancelled" and final(events).status == S.RESPONSE_STATUS_CANCELLED
    assert stored is not None and stored.response.status == S.RESPONSE_STATUS_CANCELLED
