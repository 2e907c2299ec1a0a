"""Gateway replicas sharing one PostgreSQL: real `antwort-grpc serve` processes A and B (started
once for this module) and the fake OpenAI-compatible backend they both call."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
import pytest_asyncio

from antwort_grpc import pb
from antwort_grpc.storage.base import INTERRUPTED
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply, ScriptedToolCall
from tests.harness import assert_valid_stream, function_tool, kinds, output_text, response_of, user
from tests.storage.conftest import empty_database
from tests.storage.processes import GatewayProcess, Stream, create, gateway_process, get, status_changes

pytestmark = pytest.mark.asyncio(loop_scope="module")

S = pb.ResponseStatus
SLOW = Reply(text="word " * 400, delay=0.02)
# Replicas sweep for dead ones this often (the default is 5 s).
UPKEEP = {"ANTWORT_STORE_MAINTENANCE_SECONDS": "0.1"}


@dataclass
class Replicas:
    url: str
    fake: FakeOpenAI
    a: GatewayProcess
    b: GatewayProcess


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def replicas(postgres_admin_url: str) -> AsyncIterator[Replicas]:
    async with empty_database(postgres_admin_url) as url, FakeOpenAI() as fake:
        # Started together, so they also migrate the empty schema at the same time.
        managers = [gateway_process(url, fake.url, **UPKEEP) for _ in range(2)]
        a, b = await asyncio.gather(*(m.__aenter__() for m in managers))
        try:
            yield Replicas(url, fake, a, b)
        finally:
            for manager in managers:
                await manager.__aexit__(None, None, None)


async def test_requires_action_on_replica_a_is_continued_on_replica_b(replicas: Replicas) -> None:
    call = ScriptedToolCall(name="get_weather", arguments='{"city": "Paris"}', id="call_paris")
    replicas.fake.add(Reply(tool_calls=[call]), Reply(text="Sunny in Paris."))
    request = user("Weather in Paris?")
    request.tools.append(function_tool("get_weather", city="string"))
    paused = await create(replicas.a, request)
    assert paused.status == S.RESPONSE_STATUS_REQUIRES_ACTION

    follow = pb.CreateResponseRequest(previous_response_id=paused.id)
    follow.tools.append(function_tool("get_weather", city="string"))
    follow.input_items.items.append(
        pb.Item(function_call_output=pb.FunctionCallOutput(call_id="call_paris", output='{"temp_c": 21}'))
    )
    events = await Stream(replicas.b, follow).finished()
    assert_valid_stream(events)
    done = response_of(events[-1])
    assert done.status == S.RESPONSE_STATUS_COMPLETED and output_text(done) == "Sunny in Paris."

    messages = replicas.fake.chat_requests[-1]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["id"] == "call_paris"
    assert messages[2]["tool_call_id"] == "call_paris" and messages[2]["content"] == '{"temp_c": 21}'
    assert (await get(replicas.a, done.id)) == done, "replica A reads what replica B stored"
    assert (await get(replicas.b, paused.id)) == paused


async def test_cancel_on_replica_b_ends_a_stream_running_on_replica_a(replicas: Replicas) -> None:
    replicas.fake.add(SLOW)
    stream = Stream(replicas.a, user("talk slowly"))
    await stream.wait_for_deltas(3)

    reply = await replicas.b.stub.CancelResponse(pb.CancelResponseRequest(response_id=stream.response_id))
    assert reply.response.status == S.RESPONSE_STATUS_CANCELLED

    events = await stream.finished()
    assert_valid_stream(events)
    assert kinds(events)[-1] == "cancelled"
    stored = await get(replicas.b, stream.response_id)
    assert stored.status == S.RESPONSE_STATUS_CANCELLED
    assert output_text(stored).startswith("word word word")


async def test_a_steer_sent_to_replica_b_reaches_a_stream_running_on_replica_a(replicas: Replicas) -> None:
    replicas.fake.add(Reply(text="deploying to the US region now", hold_at=3), Reply(text="Deploying to the EU."))
    stream = Stream(replicas.a, user("deploy"))
    await stream.wait_for_deltas(1)
    await replicas.fake.wait_held(10)
    part = pb.ContentPart(input_text=pb.InputText(text="use the EU region"))
    steer = pb.Control(
        steer=pb.SteerControl(items=[pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[part]))])
    )
    reply = await replicas.b.stub.ControlResponse(
        pb.ControlResponseRequest(response_id=stream.response_id, control=steer)
    )
    assert reply.response.id == stream.response_id
    # Acknowledged by the replica that runs it: where in its stream the steer came.
    assert reply.accepted.response_id == stream.response_id
    assert reply.accepted.status == S.RESPONSE_STATUS_IN_PROGRESS and reply.accepted.sequence_number >= 3
    replicas.fake.release()
    events = await stream.finished()
    assert_valid_stream(events)
    assert "input_injected" in kinds(events)
    assert output_text(response_of(events[-1])).endswith("Deploying to the EU.")
    assert replicas.fake.chat_requests[-1]["messages"][-1] == {"role": "user", "content": "use the EU region"}


async def test_a_control_for_a_response_that_ended_is_refused_on_any_replica(replicas: Replicas) -> None:
    replicas.fake.add(Reply(text="done"))
    done = await create(replicas.a, user("hi"))
    resume = pb.Control(resume=pb.ResumeControl())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await replicas.b.stub.ControlResponse(pb.ControlResponseRequest(response_id=done.id, control=resume))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_an_approval_asked_on_replica_a_is_given_on_replica_b(replicas: Replicas) -> None:
    call = ScriptedToolCall(name="send_mail", arguments='{"to": "ops"}', id="call_mail")
    replicas.fake.add(Reply(tool_calls=[call]), Reply(text="Mail sent."))
    tool = function_tool("send_mail", to="string")
    tool.require_approval.mode = pb.ApprovalMode.APPROVAL_MODE_ALWAYS
    request = user("tell ops")
    request.tools.append(tool)
    paused = await create(replicas.a, request)
    assert paused.status == S.RESPONSE_STATUS_REQUIRES_ACTION
    assert paused.output[-1].approval_request.call_id == "call_mail"

    approve = pb.CreateResponseRequest(previous_response_id=paused.id, tools=[tool])
    approve.input_items.items.add().approval_response.CopyFrom(pb.ApprovalResponse(call_id="call_mail", approve=True))
    handed = await create(replicas.b, approve)
    assert handed.status == S.RESPONSE_STATUS_REQUIRES_ACTION, "approved: the call goes to the client"

    result = pb.CreateResponseRequest(previous_response_id=handed.id, tools=[tool])
    result.input_items.items.add().function_call_output.CopyFrom(
        pb.FunctionCallOutput(call_id="call_mail", output="ok")
    )
    done = await create(replicas.a, result)
    assert done.status == S.RESPONSE_STATUS_COMPLETED and output_text(done) == "Mail sent."


async def test_a_surviving_replica_marks_a_killed_replicas_response_interrupted(replicas: Replicas) -> None:
    replicas.fake.add(SLOW)
    async with gateway_process(replicas.url, replicas.fake.url) as doomed, status_changes(replicas.url) as changes:
        stream = Stream(doomed, user("talk slowly"))
        await stream.wait_for_deltas(3)
        assert (await get(replicas.b, stream.response_id)).status == S.RESPONSE_STATUS_IN_PROGRESS
        doomed.kill()
        with pytest.raises(grpc.aio.AioRpcError):
            await stream.finished()
        # Nobody restarts anything: a live replica's periodic sweep finds the session gone.
        async with asyncio.timeout(20):
            while await changes.get() != (stream.response_id, S.RESPONSE_STATUS_FAILED):
                pass
    response = await get(replicas.b, stream.response_id)
    assert response.status == S.RESPONSE_STATUS_FAILED and response.error.code == INTERRUPTED
