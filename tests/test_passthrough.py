"""What backends honour, passed through over both doors against a real gateway on the fake
OpenAI-compatible backend (which records what it received): reasoning effort, prompt cache key
and penalties reach the backend and are echoed; the backend's usage details come back; the
tool-call limit is echoed; parallel_tool_calls false gives one call a turn; what is not honoured
is refused by name, and the spec's hints are accepted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import grpc
import pytest

from antwort_grpc import pb
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply
from antwort_grpc.testing.fake_openai_script import ScriptedToolCall
from tests.http_harness import Doors, assert_event_schema, assert_schema, running_doors, sse_events

MODEL = "fake-model"
S = pb.ResponseStatus
WEATHER = {"type": "function", "name": "weather", "parameters": {"type": "object", "properties": {}}}


@asynccontextmanager
async def doors(*replies: Reply) -> AsyncIterator[tuple[Doors, FakeOpenAI]]:
    async with FakeOpenAI(*replies) as fake:
        provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model=MODEL, max_retries=0))
        try:
            async with running_doors(provider=provider, store=MemoryStore(), model=MODEL) as running:
                yield running, fake
        finally:
            await provider.aclose()


async def post(running: Doors, body: dict[str, Any]) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(running.url + "/v1/responses", json=body) as response,
    ):
        return response.status, await response.json()


async def post_streamed(running: Doors, body: dict[str, Any]) -> list[dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(running.url + "/v1/responses", json={**body, "stream": True}) as response,
    ):
        assert response.status == 200
        return await sse_events(response)


ASKED = {
    "reasoning": {"effort": "high", "summary": None},
    "prompt_cache_key": "tenant-7",
    "presence_penalty": 0.5,
    "frequency_penalty": -0.25,
    "max_tool_calls": 3,
}


async def test_reasoning_effort_cache_key_and_penalties_reach_the_backend_and_are_echoed_over_http() -> None:
    async with doors(Reply(text="ok"), Reply(text="ok")) as (running, fake):
        status, body = await post(running, {"model": MODEL, "input": "hi", **ASKED})
        events = await post_streamed(running, {"model": MODEL, "input": "hi", **ASKED})
    assert status == 200 and body["status"] == "completed", body
    for echoed in (body, events[-1]["response"]):
        assert echoed["reasoning"] == {"effort": "high", "summary": None}
        assert echoed["prompt_cache_key"] == "tenant-7"
        assert (echoed["presence_penalty"], echoed["frequency_penalty"]) == (0.5, -0.25)
        assert echoed["max_tool_calls"] == 3
        assert_schema(echoed)
    for event in events:
        assert_event_schema(event)
    for sent in fake.chat_requests:
        assert sent["reasoning_effort"] == "high"
        assert sent["prompt_cache_key"] == "tenant-7"
        assert (sent["presence_penalty"], sent["frequency_penalty"]) == (0.5, -0.25)


async def test_reasoning_effort_reaches_the_backend_over_grpc_and_nothing_is_sent_unasked() -> None:
    async with doors(Reply(text="ok"), Reply(text="ok")) as (running, fake):
        response = await running.grpc.create(
            pb.CreateResponseRequest(
                input_text="hi",
                reasoning=pb.ReasoningConfig(effort="low"),
                prompt_cache_key="k",
                limits=pb.ExecutionLimits(max_tool_calls=2),
            )
        )
        plain = await running.grpc.create(pb.CreateResponseRequest(input_text="hi"))
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    assert response.reasoning.effort == "low" and response.prompt_cache_key == "k"
    assert response.max_tool_calls == 2
    assert not plain.HasField("reasoning") and not plain.HasField("max_tool_calls")
    asked, unasked = fake.chat_requests
    assert asked["reasoning_effort"] == "low" and asked["prompt_cache_key"] == "k"
    for name in ("reasoning_effort", "prompt_cache_key", "presence_penalty", "frequency_penalty"):
        assert name not in unasked


async def test_usage_details_come_back_from_the_backend_over_both_doors() -> None:
    detailed = {"prompt_tokens": 40, "cached_tokens": 32, "reasoning_tokens": 5, "completion_tokens": 9}
    async with doors(Reply(text="ok", **detailed), Reply(text="ok", **detailed)) as (running, _):
        response = await running.grpc.create(pb.CreateResponseRequest(input_text="hi"))
        events = await post_streamed(running, {"model": MODEL, "input": "hi"})
    assert (response.usage.cached_input_tokens, response.usage.reasoning_tokens) == (32, 5)
    usage = events[-1]["response"]["usage"]
    assert usage["input_tokens"] == 40 and usage["output_tokens"] == 9
    assert usage["input_tokens_details"] == {"cached_tokens": 32}
    assert usage["output_tokens_details"] == {"reasoning_tokens": 5}


TWO_CALLS = Reply(tool_calls=[ScriptedToolCall(name="weather", id="c1"), ScriptedToolCall(name="weather", id="c2")])


async def test_parallel_tool_calls_false_gives_at_most_one_call_a_turn_over_both_doors() -> None:
    async with doors(TWO_CALLS, TWO_CALLS, TWO_CALLS) as (running, fake):
        status, body = await post(
            running, {"model": MODEL, "input": "hi", "tools": [WEATHER], "parallel_tool_calls": False}
        )
        events = await post_streamed(
            running, {"model": MODEL, "input": "hi", "tools": [WEATHER], "parallel_tool_calls": False}
        )
        tool = pb.Tool(function=pb.FunctionTool(name="weather"))
        response = await running.grpc.create(
            pb.CreateResponseRequest(input_text="hi", tools=[tool], parallel_tool_calls=False)
        )
    assert status == 200, body
    assert [item["call_id"] for item in body["output"] if item["type"] == "function_call"] == ["c1"]
    streamed = events[-1]["response"]["output"]
    assert [item["call_id"] for item in streamed if item["type"] == "function_call"] == ["c1"]
    assert not [e for e in events if e.get("item", {}).get("call_id") == "c2"]
    assert response.status == S.RESPONSE_STATUS_REQUIRES_ACTION
    assert [item.function_call.call_id for item in response.output] == ["c1"]
    assert all(sent["parallel_tool_calls"] is False for sent in fake.chat_requests)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"reasoning": {"summary": "auto"}}, "reasoning.summary"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"include": ["file_search_call.results"]}, "include[0]"),
        ({"prompt_cache_key": "k" * 300}, "prompt_cache_key"),
        ({"presence_penalty": 3}, "presence_penalty"),
    ],
)
async def test_what_is_not_honoured_is_a_400_naming_the_parameter(extra: dict[str, Any], param: str) -> None:
    async with doors() as (running, fake):
        status, body = await post(running, {"model": MODEL, "input": "hi", **extra})
    assert status == 400 and body["error"]["param"] == param, body
    assert not fake.chat_requests


async def test_a_bad_reasoning_effort_is_invalid_argument_over_grpc() -> None:
    async with doors() as (running, _):
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await running.grpc.create(
                pb.CreateResponseRequest(input_text="hi", reasoning=pb.ReasoningConfig(effort="max"))
            )
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "reasoning.effort" in (raised.value.details() or "")


async def test_the_specs_hints_are_accepted() -> None:
    hints = {
        "service_tier": "auto",
        "safety_identifier": "u-1",
        "user": "u-1",
        "top_logprobs": 0,
        "include": ["reasoning.encrypted_content", "message.input_image.image_url"],
    }
    async with doors(Reply(text="ok")) as (running, _):
        status, body = await post(running, {"model": MODEL, "input": "hi", **hints})
    assert status == 200 and body["status"] == "completed", body


LOGPROBS = {"include": ["message.output_text.logprobs"], "top_logprobs": 2}


async def test_logprobs_reach_the_backend_and_come_back_in_the_text_and_its_deltas_over_both_doors() -> None:
    replies = [Reply(text="Hello there", logprobs=True) for _ in range(3)]
    async with doors(*replies) as (running, fake):
        status, body = await post(running, {"model": MODEL, "input": "hi", **LOGPROBS})
        events = await post_streamed(running, {"model": MODEL, "input": "hi", **LOGPROBS})
        response = await running.grpc.create(
            pb.CreateResponseRequest(input_text="hi", output_logprobs=True, top_logprobs=1)
        )
    assert status == 200, body
    assert body["top_logprobs"] == 2
    for part in (body["output"][0]["content"][0], events[-1]["response"]["output"][0]["content"][0]):
        assert [entry["token"] for entry in part["logprobs"]] == ["Hello ", "there"]
        assert part["logprobs"][0]["logprob"] == -0.5 and part["logprobs"][0]["bytes"] == list(b"Hello ")
        assert [top["token"] for top in part["logprobs"][0]["top_logprobs"]] == ["Hello ", "x"]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [entry["token"] for e in deltas for entry in e["logprobs"]] == ["Hello ", "there"]
    for event in events:
        assert_event_schema(event)
    assert_schema(body)
    logged = response.output[0].message.content[0].output_text.logprobs
    assert [entry.token for entry in logged] == ["Hello ", "there"]
    sent = fake.chat_requests
    assert [(s.get("logprobs"), s.get("top_logprobs")) for s in sent] == [(True, 2), (True, 2), (True, 1)]


async def test_no_logprobs_are_asked_for_unless_the_request_does() -> None:
    async with doors(Reply(text="Hello there", logprobs=True)) as (running, fake):
        status, body = await post(running, {"model": MODEL, "input": "hi"})
    assert status == 200 and body["output"][0]["content"][0]["logprobs"] == []
    assert "logprobs" not in fake.chat_requests[0] and "top_logprobs" not in fake.chat_requests[0]
