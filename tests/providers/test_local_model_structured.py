"""Structured output from the embedded local model (llama.cpp's server constrains the answer with
the JSON schema it is sent as `response_format`): what `make run` answers, over both doors."""

from __future__ import annotations

import json

import openai
import pytest
from google.protobuf import struct_pb2
from pydantic import BaseModel, Field

from antwort_grpc import pb
from antwort_grpc.providers import local_model
from antwort_grpc.providers.local_model import LocalModelProvider
from tests.harness import output_text
from tests.http_harness import running_doors

CAPITAL = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "country": {"type": "string", "maxLength": 20}},
    "required": ["city", "country"],
    "additionalProperties": False,
}


class Capital(BaseModel):
    city: str = Field(max_length=20)
    country: str = Field(max_length=20)


# A real model on two shared cores: two answers take about 30 s on an idle host, three times that
# when the host is busy.
@pytest.mark.timeout(300)
async def test_the_local_model_answers_json_valid_against_the_schema_over_both_doors() -> None:
    model = local_model.model_file()
    assert model is not None
    provider = LocalModelProvider(model)
    schema = struct_pb2.Struct()
    schema.update(CAPITAL)
    form = pb.TextFormat(json_schema=pb.JsonSchemaFormat(name="capital", schema=schema, strict=True))
    request = pb.CreateResponseRequest(
        input_text="What is the capital of France?",
        temperature=0,
        max_output_tokens=48,
        text=pb.TextConfig(format=form),
    )
    try:
        async with running_doors(provider=provider, executors=[], model=local_model.MODEL_NAME) as doors:
            response = await doors.grpc.create(request)
            client = openai.AsyncOpenAI(base_url=doors.base_url, api_key="unused", max_retries=0)
            try:
                parsed = await client.responses.parse(
                    model=local_model.MODEL_NAME, input="What is the capital of Italy?", text_format=Capital,
                    temperature=0, max_output_tokens=48,
                )  # fmt: skip
            finally:
                await client.close()
    finally:
        await provider.aclose()
    assert response.status == pb.ResponseStatus.RESPONSE_STATUS_COMPLETED, response.error
    answer = json.loads(output_text(response))
    assert set(answer) == {"city", "country"} and all(isinstance(v, str) for v in answer.values())
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, Capital)
