"""Continuations of a paused response send a history OpenAI accepts: the fake backend in strict mode
rejects what OpenAI's Chat Completions API rejects, and the gateway runs against it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from antwort_grpc import pb
from antwort_grpc.executors.base import FunctionExecutor
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.providers.openai.request import NO_RESULT
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply, ScriptedToolCall
from tests.harness import GatewayClient, function_tool, output_text, running_gateway, user

S = pb.ResponseStatus
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}


async def post(fake: FakeOpenAI, messages: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        body = {"model": "fake-model", "messages": messages}
        async with session.post(f"{fake.url}/chat/completions", json=body) as answer:
            return answer.status, await answer.json()


async def test_strict_backend_rejects_a_tool_call_without_its_tool_message() -> None:
    async with FakeOpenAI(Reply(text="fine"), strict=True) as fake:
        status, body = await post(
            fake,
            [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "user", "content": "never mind"},
            ],
        )
    assert status == 400
    assert body["error"]["type"] == "invalid_request_error"
    assert "did not have response messages: call_1" in body["error"]["message"]


async def test_strict_backend_rejects_a_tool_message_that_answers_no_call() -> None:
    async with FakeOpenAI(Reply(text="fine"), strict=True) as fake:
        status, body = await post(
            fake, [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "call_9", "content": "x"}]
        )
    assert status == 400
    assert "role 'tool' must be a response" in body["error"]["message"]


async def test_strict_backend_rejects_call_arguments_that_are_not_json() -> None:
    async with FakeOpenAI(Reply(text="fine"), strict=True) as fake:
        cut = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"cit'}}
        status, body = await post(
            fake,
            [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [cut]},
                {"role": "tool", "tool_call_id": "call_1", "content": "superseded"},
            ],
        )
    assert status == 400
    assert "tool_calls[0].function.arguments" in body["error"]["message"]


async def test_strict_backend_accepts_every_call_answered_at_once() -> None:
    async with FakeOpenAI(Reply(text="fine"), strict=True) as fake:
        status, _ = await post(
            fake,
            [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": "21"},
            ],
        )
    assert status == 200


@asynccontextmanager
async def strict_gateway(*replies: Reply) -> AsyncIterator[tuple[GatewayClient, FakeOpenAI]]:
    async with FakeOpenAI(*replies, strict=True) as fake:
        provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model="fake-model"))
        try:
            async with running_gateway(
                provider=provider, executors=[FunctionExecutor()], store=MemoryStore(), model="fake-model"
            ) as gw:
                yield gw, fake
        finally:
            await provider.aclose()


def weather_request() -> pb.CreateResponseRequest:
    request = user("Weather in Paris and Rome?")
    request.tools.append(function_tool("get_weather", city="string"))
    return request


TWO_CALLS = Reply(
    tool_calls=[
        ScriptedToolCall(id="call_paris", name="get_weather", arguments='{"city": "Paris"}'),
        ScriptedToolCall(id="call_rome", name="get_weather", arguments='{"city": "Rome"}'),
    ]
)


async def test_a_plain_text_continuation_of_requires_action_tells_the_model_no_result_was_provided() -> None:
    async with strict_gateway(TWO_CALLS, Reply(text="Alright, no weather then.")) as (gw, fake):
        first = await gw.create(weather_request())
        assert first.status == S.RESPONSE_STATUS_REQUIRES_ACTION
        follow = user("never mind")
        follow.previous_response_id = first.id
        second = await gw.create(follow)
    assert second.status == S.RESPONSE_STATUS_COMPLETED, second.error.message
    assert output_text(second) == "Alright, no weather then."
    sent = fake.chat_requests[1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool", "user"]
    assert [(m["tool_call_id"], m["content"]) for m in sent[2:4]] == [
        ("call_paris", NO_RESULT),
        ("call_rome", NO_RESULT),
    ]


async def test_outputs_sent_after_new_text_go_right_after_their_calls_and_a_missing_one_is_filled() -> None:
    async with strict_gateway(TWO_CALLS, Reply(text="Paris is sunny.")) as (gw, fake):
        first = await gw.create(weather_request())
        paris = pb.Item(function_call_output=pb.FunctionCallOutput(call_id="call_paris", output="sunny"))
        note = pb.Item(
            message=pb.Message(
                role=pb.Role.ROLE_USER, content=[pb.ContentPart(input_text=pb.InputText(text="Rome later"))]
            )
        )
        follow = pb.CreateResponseRequest(previous_response_id=first.id, input_items=pb.ItemList(items=[note, paris]))
        second = await gw.create(follow)
    assert second.status == S.RESPONSE_STATUS_COMPLETED, second.error.message
    sent = fake.chat_requests[1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool", "user"]
    assert [(m["tool_call_id"], m["content"]) for m in sent[2:4]] == [("call_paris", "sunny"), ("call_rome", NO_RESULT)]
