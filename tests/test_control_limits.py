"""What controls may add to a running response is bounded, and a control is answered with a small
acknowledgement: steering messages queue within a count and a byte cap like follow-ups, a control
carries a bounded number of items, and a response never grows past what it could be read back
and continued with (the history cap). Through a real gateway and its HTTP door; a scripted model
and a tool the test holds keep the run where the test wants it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import grpc
import pytest

from antwort_grpc import pb
from antwort_grpc.executors.base import FunctionExecutor
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text
from tests.harness import GatewayClient, assert_valid_stream, function_tool, kind, running_gateway, user
from tests.http_harness import Doors, running_doors
from tests.test_interactive_runs import GatedTool, Session, steer

S = pb.ResponseStatus
CODE = grpc.StatusCode


def _message(text: str) -> pb.Item:
    part = pb.ContentPart(input_text=pb.InputText(text=text))
    return pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[part]))


def steer_of(*texts: str) -> pb.Control:
    return pb.Control(steer=pb.SteerControl(items=[_message(t) for t in texts]))


def _provider() -> ScriptedProvider:
    # A third answer for a follow-up.
    return ScriptedProvider([[Call.of("slow", {}, call_id="s")], [Text("Done.")], [Text("And more.")]])


@asynccontextmanager
async def held_in_a_tool(**settings: Any) -> AsyncIterator[tuple[GatewayClient, GatedTool, str, Any]]:
    """A gateway whose response is held in its `slow` tool call (steers wait for the round's end):
    the client, the tool, the response id and its stream."""
    tool = GatedTool()
    async with running_gateway(provider=_provider(), executors=[FunctionExecutor(), tool], **settings) as gw:
        request = user("Start")
        request.stream = True
        request.tools.append(function_tool("slow"))
        call = gw.stub.CreateResponse(request)
        response_id = (await call.read()).event.created.response.id
        await tool.started.wait()
        yield gw, tool, response_id, call


async def control(gw: GatewayClient, response_id: str, sent: pb.Control) -> pb.ControlResponseResponse:
    answer: pb.ControlResponseResponse = await gw.stub.ControlResponse(
        pb.ControlResponseRequest(response_id=response_id, control=sent)
    )
    return answer


async def refused(gw: GatewayClient, response_id: str, sent: pb.Control) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await control(gw, response_id, sent)
    return info.value.code(), info.value.details() or ""


async def rest_of(call: Any) -> list[pb.StreamEvent]:
    events = []
    while (message := await call.read()) is not grpc.aio.EOF:
        events.append(message.event)
    return events


def injected(events: list[pb.StreamEvent]) -> int:
    return sum(len(e.input_injected.items) for e in events if kind(e) == "input_injected")


# -- steering messages queue within their caps ------------------------------------------------------


async def test_steers_past_the_count_cap_are_refused_and_the_queued_ones_join() -> None:
    async with held_in_a_tool(max_steers=4) as (gw, tool, response_id, call):
        for n in range(4):
            await control(gw, response_id, steer(f"steer {n}"))
        code, details = await refused(gw, response_id, steer("one too many"))
        tool.release.set()
        events = await rest_of(call)
    assert code == CODE.RESOURCE_EXHAUSTED and "at most 4 steer" in details
    assert injected(events) == 4, "the four queued steers joined the conversation, the fifth did not"
    assert events[-1].completed.response.status == S.RESPONSE_STATUS_COMPLETED


async def test_steers_past_the_byte_cap_are_refused() -> None:
    text = "x" * 400
    async with held_in_a_tool(max_steer_bytes=1000) as (gw, tool, response_id, call):
        await control(gw, response_id, steer(text))
        await control(gw, response_id, steer(text))
        code, details = await refused(gw, response_id, steer(text))
        tool.release.set()
        events = await rest_of(call)
    assert code == CODE.RESOURCE_EXHAUSTED and "1000 bytes in all" in details
    assert injected(events) == 2


async def test_a_steer_too_large_for_the_queue_alone_is_refused_as_too_large() -> None:
    async with held_in_a_tool(max_steer_bytes=1000) as (gw, tool, response_id, call):
        code, details = await refused(gw, response_id, steer("x" * 2000))
        tool.release.set()
        events = await rest_of(call)
    assert code == CODE.RESOURCE_EXHAUSTED and "more than the 1000 bytes" in details
    assert injected(events) == 0


async def test_a_steer_with_more_items_than_a_control_may_carry_is_refused() -> None:
    async with held_in_a_tool(max_control_items=3) as (gw, tool, response_id, call):
        code, details = await refused(gw, response_id, steer_of("a", "b", "c", "d"))
        await control(gw, response_id, steer_of("a", "b", "c"))
        tool.release.set()
        events = await rest_of(call)
    assert code == CODE.RESOURCE_EXHAUSTED and "at most 3 items" in details
    assert injected(events) == 3


async def test_a_steer_on_a_converse_stream_past_the_cap_is_rejected_in_band() -> None:
    tool = GatedTool()
    async with running_gateway(provider=_provider(), executors=[FunctionExecutor(), tool], max_steers=1) as gw:
        session = Session(gw)
        request = user("Start")
        request.tools.append(function_tool("slow"))
        await session.start(request)
        await session.until("tool_execution_in_progress")
        await session.send(steer("first"))
        await session.send(steer("second"))
        await session.until("rejected")
        tool.release.set()
        await session.until("terminal")
    [rejected] = session.rejected
    assert rejected.code == CODE.RESOURCE_EXHAUSTED.value[0] and rejected.reason == "steer_queue_full"
    assert injected(session.response_events()) == 1
    assert_valid_stream(session.response_events())


# -- a response stays readable: the history cap bounds what controls add ----------------------------


async def test_controls_cannot_grow_a_response_past_the_history_cap_and_it_stays_readable() -> None:
    cap = 64 * 1024
    big = "y" * 25_000
    async with held_in_a_tool(history_max_bytes=cap, max_steer_bytes=cap, max_follow_up_bytes=cap) as (
        gw,
        tool,
        response_id,
        call,
    ):
        await control(gw, response_id, steer(big))
        await control(gw, response_id, pb.Control(follow_up=pb.FollowUpControl(items=[_message(big)])))
        code, details = await refused(gw, response_id, steer(big))
        tool.release.set()
        events = await rest_of(call)
        stored = await gw.stub.GetResponse(pb.GetResponseRequest(response_id=response_id))
    assert code == CODE.RESOURCE_EXHAUSTED and f"pass {cap} bytes" in details
    assert stored.response.ByteSize() <= cap
    assert events[-1].WhichOneof("event") == "completed"


# -- a control's answer is small ---------------------------------------------------------------------


async def test_a_control_is_answered_with_an_acknowledgement_not_the_response() -> None:
    async with held_in_a_tool() as (gw, _tool, response_id, call):
        # The response is large; the answer to a pause is not.
        answer = await control(gw, response_id, steer("z" * 100_000))
        pause = await control(gw, response_id, pb.Control(pause=pb.PauseControl(reason="look")))
        cancelled = await control(gw, response_id, pb.Control(cancel=pb.CancelControl()))
        events = await rest_of(call)
    for acknowledged in (answer, pause):
        assert acknowledged.accepted.response_id == response_id
        assert acknowledged.accepted.status == S.RESPONSE_STATUS_IN_PROGRESS
        assert acknowledged.accepted.sequence_number >= 3  # created, in_progress, and what followed
        assert acknowledged.ByteSize() < 200, "id, status and sequence number only"
        # Clients built before `accepted` read the response's id and status where they were.
        assert acknowledged.response.id == response_id and not acknowledged.response.output
    assert pause.accepted.sequence_number >= answer.accepted.sequence_number
    assert cancelled.accepted.status == S.RESPONSE_STATUS_CANCELLED
    assert cancelled.accepted.sequence_number == events[-1].sequence_number, "after its terminal event"


# -- the HTTP door maps the caps ---------------------------------------------------------------------


@asynccontextmanager
async def http_held(**settings: Any) -> AsyncIterator[tuple[Doors, GatedTool, str, Any]]:
    tool = GatedTool()
    async with running_doors(provider=_provider(), executors=[FunctionExecutor(), tool], **settings) as doors:
        request = user("Start")
        request.stream = True
        request.tools.append(function_tool("slow"))
        call = doors.grpc.stub.CreateResponse(request)
        response_id = (await call.read()).event.created.response.id
        await tool.started.wait()
        yield doors, tool, response_id, call


async def test_the_http_door_answers_a_full_queue_429_and_a_control_too_large_413() -> None:
    async with http_held(max_steers=1, max_control_items=2) as (doors, tool, response_id, call):
        url = f"{doors.url}/v1/responses/{response_id}/steer"
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json={"input": "first"}) as first:
                acknowledged = (first.status, await first.json())
            async with session.post(url, json={"input": "second"}) as second:
                full = (second.status, await second.json())
            many = [{"role": "user", "content": f"m{n}"} for n in range(3)]
            async with session.post(url, json={"input": many}) as third:
                large = (third.status, await third.json())
        tool.release.set()
        await rest_of(call)
    assert acknowledged[0] == 200 and acknowledged[1]["object"] == "response.control"
    assert acknowledged[1]["id"] == response_id and acknowledged[1]["status"] == "in_progress"
    assert full[0] == 429 and full[1]["error"]["code"] == "steer_queue_full"
    assert large[0] == 413 and large[1]["error"]["code"] == "control_too_large"
