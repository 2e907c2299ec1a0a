"""Structured output (`text.format` json_schema / json_object) over both doors, against a real
gateway on the fake OpenAI-compatible backend: the backend is asked with `response_format`, the
format is echoed, an answer that does not match ends the response failed (never a silent pass),
and a backend that refuses the parameter says so. The official OpenAI SDK's `responses.parse`
with a pydantic model works unchanged against the HTTP door."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import openai
import pytest
from google.protobuf import struct_pb2
from pydantic import BaseModel

from antwort_grpc import pb
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply
from tests.http_harness import Doors, assert_event_schema, assert_schema, running_doors, sse_events

MODEL = "fake-model"
S = pb.ResponseStatus
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer", "minimum": 0}},
    "required": ["city", "population"],
    "additionalProperties": False,
}
JSON_SCHEMA = {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}


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


def grpc_request(schema: dict[str, Any] = CITY, **fields: Any) -> pb.CreateResponseRequest:
    struct = struct_pb2.Struct()
    struct.update(schema)
    form = pb.TextFormat(json_schema=pb.JsonSchemaFormat(name="city", schema=struct, strict=True))
    return pb.CreateResponseRequest(input_text="Paris?", text=pb.TextConfig(format=form), **fields)


# --------------------------------------------------------------------------- the backend is asked


async def test_a_json_schema_format_reaches_the_backend_as_response_format_over_both_doors() -> None:
    answer = '{"city": "Paris", "population": 2100000}'
    async with doors(Reply(text=answer), Reply(text=answer)) as (running, fake):
        status, body = await post(running, {"model": MODEL, "input": "Paris?", "text": {"format": JSON_SCHEMA}})
        assert status == 200 and body["status"] == "completed", body
        assert body["output"][0]["content"][0]["text"] == answer
        assert body["text"] == {
            "format": {"type": "json_schema", "name": "city", "description": None, "schema": None, "strict": True}
        }
        assert_schema(body)
        response = await running.grpc.create(grpc_request())
        assert response.status == S.RESPONSE_STATUS_COMPLETED
        assert response.text.format.json_schema.name == "city" and response.text.format.json_schema.strict
        for received in fake.chat_requests:
            assert received["response_format"] == {
                "type": "json_schema",
                "json_schema": {"name": "city", "schema": CITY, "strict": True},
            }


async def test_a_request_without_a_format_sends_no_response_format_and_echoes_plain_text() -> None:
    async with doors(Reply(text="hello")) as (running, fake):
        status, body = await post(running, {"model": MODEL, "input": "hi", "text": {"format": {"type": "text"}}})
        assert status == 200 and body["text"] == {"format": {"type": "text"}}
        assert "response_format" not in fake.chat_requests[0]


async def test_json_object_asks_for_an_object_and_refuses_anything_else() -> None:
    async with doors(Reply(text='{"ok": true}'), Reply(text="[1, 2]")) as (running, fake):
        ok = await running.grpc.create(
            pb.CreateResponseRequest(
                input_text="JSON please",
                text=pb.TextConfig(format=pb.TextFormat(json_object=pb.JsonObjectFormat())),
            )
        )
        assert ok.status == S.RESPONSE_STATUS_COMPLETED
        status, body = await post(
            running, {"model": MODEL, "input": "JSON", "text": {"format": {"type": "json_object"}}}
        )
        assert status == 200 and body["status"] == "failed", body
        assert body["error"]["code"] == "output_format_mismatch"
        assert "not an object" in body["error"]["message"]
        assert body["text"] == {"format": {"type": "json_object"}}
        assert_schema(body)
        assert [r["response_format"] for r in fake.chat_requests] == [{"type": "json_object"}] * 2


# ---------------------------------------------------------------------- the answer is checked


async def test_an_answer_that_does_not_match_the_schema_fails_the_response_and_keeps_the_answer() -> None:
    wrong = '{"city": "Paris", "population": -3}'
    async with doors(Reply(text=wrong), Reply(text="Paris has about two million people.")) as (running, _):
        response = await running.grpc.create(grpc_request())
        assert response.status == S.RESPONSE_STATUS_FAILED
        assert response.error.code == "output_format_mismatch"
        assert "'city'" in response.error.message and "/population" in response.error.message
        assert response.output[0].message.content[0].output_text.text == wrong
        stored = await running.grpc.store.get(response.id)
        assert stored is not None and stored.response.status == S.RESPONSE_STATUS_FAILED
        # Streamed over HTTP: the text went out as it came, the terminal event says failed.
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                running.url + "/v1/responses",
                json={"model": MODEL, "input": "Paris?", "text": {"format": JSON_SCHEMA}, "stream": True},
            ) as streamed,
        ):
            events = await sse_events(streamed)
    for event in events:
        assert_event_schema(event)
    assert events[-1]["type"] == "response.failed"
    failed = events[-1]["response"]
    assert failed["error"]["code"] == "output_format_mismatch" and "not JSON" in failed["error"]["message"]
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta").startswith("Paris has")


async def test_a_refusal_is_not_checked_against_the_schema() -> None:
    async with doors(Reply(refusal="I cannot help with that.")) as (running, _):
        response = await running.grpc.create(grpc_request())
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    assert response.output[-1].message.content[0].refusal.refusal == "I cannot help with that."


# ------------------------------------------------------------------------------ bad formats


@pytest.mark.parametrize(
    ("form", "param", "words"),
    [
        ({"type": "json_schema", "schema": CITY}, "text.format.name", "must be a string"),
        ({"type": "json_schema", "name": "a b", "schema": CITY}, "text.format.name", "1-64 characters"),
        ({"type": "json_schema", "name": "city"}, "text.format.schema", "must be an object"),
        ({"type": "json_schema", "name": "city", "schema": {"type": 7}}, "text.format.schema", "not a valid JSON"),
        (
            {"type": "json_schema", "name": "city", "schema": {"$ref": "https://example.com/s.json"}},
            "text.format.schema",
            "not a usable JSON Schema",
        ),
        ({"type": "json_schema", "name": "city", "schema": CITY, "strict": "yes"}, "text.format.strict", "boolean"),
        ({"type": "yaml"}, "text.format.type", "unknown text format"),
    ],
)
async def test_a_bad_format_is_a_400_naming_its_parameter(form: dict[str, Any], param: str, words: str) -> None:
    async with doors() as (running, fake):
        status, body = await post(running, {"model": MODEL, "input": "hi", "text": {"format": form}})
        assert status == 400 and body["error"]["param"] == param, body
        assert words in body["error"]["message"]
        assert not fake.chat_requests


async def test_a_schema_past_the_limits_is_invalid_argument_over_grpc() -> None:
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(11):
        deep = {"type": "object", "properties": {"x": deep}}
    big = {"type": "object", "description": "x" * 70_000}
    async with doors() as (running, _):
        for schema, words in ((deep, "nested at most"), (big, "bytes serialized")):
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await running.grpc.create(grpc_request(schema))
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "text.format.json_schema.schema" in (raised.value.details() or "")
            assert words in (raised.value.details() or "")


# ------------------------------------------------------------------- a backend that refuses it


async def test_a_backend_that_refuses_response_format_fails_the_response_naming_the_parameter() -> None:
    refusal = Reply(status=400, error_message="response_format json_schema is not supported by this model")
    async with doors(refusal) as (running, _):
        status, body = await post(running, {"model": MODEL, "input": "Paris?", "text": {"format": JSON_SCHEMA}})
    assert status == 200 and body["status"] == "failed", body
    assert body["error"]["code"] == "text_format_unsupported"
    assert "text.format" in body["error"]["message"] and "response_format" in body["error"]["message"]


# --------------------------------------------------------------------- the official OpenAI SDK


class City(BaseModel):
    city: str
    population: int


async def test_the_openai_sdks_responses_parse_returns_the_pydantic_model() -> None:
    answer = json.dumps({"city": "Lyon", "population": 520000})
    async with doors(Reply(text=answer)) as (running, fake):
        client = openai.AsyncOpenAI(base_url=running.base_url, api_key="unused", max_retries=0)
        try:
            parsed = await client.responses.parse(model=MODEL, input="Lyon?", text_format=City)
        finally:
            await client.close()
    assert parsed.status == "completed"
    assert parsed.output_parsed == City(city="Lyon", population=520000)
    sent = fake.chat_requests[0]["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["name"] == "City"
    assert sent["json_schema"]["strict"] is True
    assert set(sent["json_schema"]["schema"]["required"]) == {"city", "population"}


# ----------------------------------------------------------------------------------- the CLI


async def test_the_cli_asks_for_structured_output_with_json_schema(tmp_path: Path) -> None:
    schema_file = tmp_path / "city.json"
    schema_file.write_text(json.dumps(CITY))
    answer = '{"city": "Nice", "population": 340000}'
    async with doors(Reply(text=answer), Reply(text=answer)) as (running, fake):
        for given in (str(schema_file), json.dumps({**CITY, "title": "City facts"})):
            process = await asyncio.create_subprocess_exec(
                ANTWORT, "ask", "-t", running.grpc.target, "--json-schema", given, "Nice?",
                env={k: v for k, v in os.environ.items() if not k.startswith("ANTWORT_")},
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
            out, _ = await process.communicate()
            assert process.returncode == 0, out.decode()
            assert answer in out.decode()
    names = [r["response_format"]["json_schema"]["name"] for r in fake.chat_requests]
    assert names == ["city", "City_facts"]
    assert all(r["response_format"]["json_schema"]["schema"] == CITY for r in fake.chat_requests[:1])


ANTWORT = str(Path(sys.executable).parent / "antwort-grpc")


# ---------------------------------------------------------------------------- the wire, unit


def test_response_format_sends_whole_numbers_as_integers() -> None:
    from antwort_grpc.providers.openai.request import response_format

    schema = struct_pb2.Struct()
    schema.update({"type": "string", "maxLength": 20, "enum": ["a", 1.5], "items": [{"minItems": 2}]})
    form = pb.TextFormat(json_schema=pb.JsonSchemaFormat(name="n", schema=schema, description="d"))
    sent = json.dumps(response_format(form))
    assert "20.0" not in sent and "2.0" not in sent and "1.5" in sent
    assert json.loads(sent)["json_schema"] == {
        "name": "n",
        "description": "d",
        "schema": {"type": "string", "maxLength": 20, "enum": ["a", 1.5], "items": [{"minItems": 2}]},
    }


async def test_the_scripted_stand_in_answers_in_the_form_asked_for() -> None:
    from antwort_grpc.providers.scripted import ScriptedProvider, ToolCaller

    class Weather(BaseModel):
        summary: str
        temperature: int
        sunny: bool

    async with running_doors(provider=ScriptedProvider([ToolCaller()], repeat=True), model="scripted") as running:
        client = openai.AsyncOpenAI(base_url=running.base_url, api_key="unused", max_retries=0)
        try:
            parsed = await client.responses.parse(model="scripted", input="Weather?", text_format=Weather)
            plain = await client.responses.create(
                model="scripted", input="Hi", text={"format": {"type": "json_object"}}
            )
        finally:
            await client.close()
    assert parsed.status == "completed" and parsed.output_parsed is not None
    assert parsed.output_parsed.temperature == 0 and parsed.output_parsed.summary.startswith("Hello!")
    assert plain.status == "completed" and json.loads(plain.output_text)["answer"].startswith("Hello!")
