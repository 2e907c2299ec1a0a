"""What a model cannot do is refused before the response starts, over both doors against a real
gateway: an image for a model that reads text only. And a client function tool that needed
approval answers, once approved, with the call to run last in the output (as OpenAI's API does),
over HTTP and gRPC alike; the call's result then reaches the backend as one call and its answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import grpc
import pytest

from antwort_grpc import pb
from antwort_grpc.providers.base import Capabilities
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.providers.scripted import ScriptedProvider, Text
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply
from antwort_grpc.testing.fake_openai_script import ScriptedToolCall
from tests.http_harness import Doors, assert_schema, running_doors

MODEL = "fake-model"
S = pb.ResponseStatus
PIXEL = (
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
WITH_IMAGE = [
    {
        "role": "user",
        "content": [{"type": "input_text", "text": "What is this?"}, {"type": "input_image", "image_url": PIXEL}],
    }
]


async def post(running: Doors, body: dict[str, Any]) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(running.url + "/v1/responses", json=body) as response,
    ):
        return response.status, await response.json()


async def test_an_image_for_a_text_only_model_is_refused_before_the_response_starts_over_both_doors() -> None:
    provider = ScriptedProvider([[Text("never")]], repeat=True)
    provider.capabilities = Capabilities(reads_images=False, name="the text model", instead="a vision model")  # type: ignore[attr-defined]
    store = MemoryStore()
    async with running_doors(provider=provider, store=store, model=MODEL) as running:
        status, body = await post(running, {"model": MODEL, "input": WITH_IMAGE})
        image = pb.ContentPart(input_image=pb.InputImage(image_url=PIXEL))
        item = pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[image]))
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await running.grpc.create(pb.CreateResponseRequest(input_items=pb.ItemList(items=[item])))
        plain_status, plain = await post(running, {"model": MODEL, "input": "no image"})
    assert status == 400 and body["error"]["param"] == "input[0].content[1]", body
    assert body["error"]["code"] == "image_unsupported"
    assert "does not read images" in body["error"]["message"] and "a vision model" in body["error"]["message"]
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input_items.items[0].message.content[0].input_image" in (raised.value.details() or "")
    assert plain_status == 200 and plain["status"] == "completed"
    assert len(provider.requests) == 1  # only the text request reached the model


async def test_a_backend_that_says_it_reads_no_images_fails_the_response_at_once_without_retries() -> None:
    # llama.cpp's server answers a text-only model's image with a 500 that no retry changes.
    refusal = Reply(status=500, error_message="image input is not supported - hint: you may need to provide the mmproj")
    async with FakeOpenAI(refusal, Reply(text="unused")) as fake:
        provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model=MODEL, max_retries=3))
        try:
            async with running_doors(provider=provider, store=MemoryStore(), model=MODEL) as running:
                status, body = await post(running, {"model": MODEL, "input": WITH_IMAGE})
        finally:
            await provider.aclose()
    assert status == 200 and body["status"] == "failed", body
    assert body["error"]["code"] == "image_unsupported"
    assert len(fake.chat_requests) == 1


WEATHER = {
    "type": "function",
    "name": "weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "require_approval": "always",
}
CALL = ScriptedToolCall(name="weather", arguments='{"city": "Oslo"}', id="call_w")


@asynccontextmanager
async def fake_doors(*replies: Reply) -> AsyncIterator[tuple[Doors, FakeOpenAI]]:
    async with FakeOpenAI(*replies) as fake:
        provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model=MODEL, max_retries=0))
        try:
            async with running_doors(provider=provider, store=MemoryStore(), model=MODEL) as running:
                yield running, fake
        finally:
            await provider.aclose()


async def test_approving_a_client_function_tool_over_http_answers_with_the_call_to_run_last() -> None:
    async with fake_doors(Reply(tool_calls=[CALL]), Reply(text="Sunny in Oslo.")) as (running, fake):
        status, first = await post(running, {"model": MODEL, "input": "Weather?", "tools": [WEATHER]})
        assert status == 200, first
        (request,) = [item for item in first["output"] if item["type"] == "mcp_approval_request"]
        approve = {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}
        status, second = await post(
            running, {"model": MODEL, "previous_response_id": first["id"], "tools": [WEATHER], "input": [approve]}
        )
        assert status == 200 and second["status"] == "completed", second
        last = second["output"][-1]
        assert (last["type"], last["call_id"], last["name"]) == ("function_call", "call_w", "weather")
        assert last["arguments"] == '{"city": "Oslo"}'
        assert_schema(second)
        result = {"type": "function_call_output", "call_id": "call_w", "output": "sunny"}
        status, third = await post(
            running, {"model": MODEL, "previous_response_id": second["id"], "tools": [WEATHER], "input": [result]}
        )
    assert status == 200 and third["status"] == "completed", third
    assert third["output"][-1]["content"][0]["text"] == "Sunny in Oslo."
    # The backend saw the call once, answered: a history it accepts.
    sent = fake.chat_requests[-1]["messages"]
    assert next(m for m in sent if m.get("tool_calls"))["tool_calls"][0]["id"] == "call_w"
    assert sum(len(m.get("tool_calls") or []) for m in sent) == 1


async def test_approving_a_client_function_tool_over_grpc_requires_action_with_the_call_in_the_output() -> None:
    approval = pb.RequireApproval(mode=pb.ApprovalMode.APPROVAL_MODE_ALWAYS)
    tool = pb.Tool(function=pb.FunctionTool(name="weather"), require_approval=approval)
    async with fake_doors(Reply(tool_calls=[CALL])) as (running, _):
        first = await running.grpc.create(pb.CreateResponseRequest(input_text="Weather?", tools=[tool]))
        (waiting,) = [item for item in first.output if item.WhichOneof("kind") == "approval_request"]
        decision = pb.Item(
            approval_response=pb.ApprovalResponse(call_id=waiting.approval_request.call_id, approve=True)
        )
        second = await running.grpc.create(
            pb.CreateResponseRequest(
                previous_response_id=first.id, tools=[tool], input_items=pb.ItemList(items=[decision])
            )
        )
    assert second.status == S.RESPONSE_STATUS_REQUIRES_ACTION
    assert second.output[-1].function_call.call_id == "call_w"
