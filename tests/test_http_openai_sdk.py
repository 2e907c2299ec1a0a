"""The official OpenAI Python SDK (`openai`, pinned) as the HTTP door's client, against a real gateway
on the fake OpenAI-compatible backend: create, stream (every event parsed by the SDK's own models),
retrieve, delete, cancel, input_items paging, a function-call round trip with previous_response_id,
and errors as the SDK's exception types. Every body and event is also checked against the spec's
schema (the OpenAPI document bundled in llm-comply)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import openai
import pytest
from openai.types.responses import ResponseStreamEvent

from antwort_grpc.executors.base import FunctionExecutor
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply, ScriptedToolCall
from tests.auth_fixtures import api_keys
from tests.http_harness import Doors, assert_event_schema, assert_schema, running_doors

MODEL = "fake-model"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@asynccontextmanager
async def sdk(*replies: Reply, loop: bool = False) -> AsyncIterator[tuple[openai.AsyncOpenAI, Doors, FakeOpenAI]]:
    async with FakeOpenAI(*replies, loop=loop) as fake:
        provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model=MODEL))
        try:
            async with running_doors(
                provider=provider, executors=[FunctionExecutor()], store=MemoryStore(), model=MODEL
            ) as doors:
                # No retries: a test sees the first answer the gateway gives.
                client = openai.AsyncOpenAI(base_url=doors.base_url, api_key="unused", max_retries=0)
                try:
                    yield client, doors, fake
                finally:
                    await client.close()
        finally:
            await provider.aclose()


def spec_checked(response: openai.types.responses.Response) -> None:
    assert_schema(response.model_dump(mode="json", exclude_unset=True))


async def test_the_sdk_creates_a_response_and_reads_its_text() -> None:
    async with sdk(Reply(text="Bonjour tout le monde.")) as (client, _, _):
        response = await client.responses.create(model=MODEL, input="Say hello in French.")
    assert response.status == "completed"
    assert response.output_text == "Bonjour tout le monde."
    assert response.usage is not None and response.usage.input_tokens == 7
    spec_checked(response)


async def test_the_sdk_streams_every_event_through_its_own_models() -> None:
    async with sdk(Reply(text="one two three")) as (client, _, _):
        stream = await client.responses.create(model=MODEL, input="Count.", stream=True)
        events = [event async for event in stream]
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert "response.output_text.delta" in types and "response.output_text.done" in types
    for event in events:
        # Parsed into the SDK's model of its type, not a loose fallback.
        assert type(event).__name__ != "BaseModel" and event.type in _sdk_event_types(), event
        assert_event_schema(event.model_dump(mode="json", exclude_unset=True))
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(set(numbers))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "one two three"


def _sdk_event_types() -> set[str]:
    import typing

    union = typing.get_args(typing.get_args(ResponseStreamEvent)[0])
    return {typing.get_args(model.model_fields["type"].annotation)[0] for model in union}


async def test_the_sdk_stream_helper_assembles_the_final_response() -> None:
    async with (
        sdk(Reply(text="assembled text")) as (client, _, _),
        client.responses.stream(model=MODEL, input="Say it.") as stream,
    ):
        async for _ in stream:
            pass
        final = await stream.get_final_response()
    assert final.output_text == "assembled text"


async def test_the_sdk_retrieves_and_deletes_a_response() -> None:
    async with sdk(Reply(text="kept")) as (client, _, _):
        created = await client.responses.create(model=MODEL, input="Keep this.")
        again = await client.responses.retrieve(created.id)
        assert again.id == created.id and again.output_text == "kept"
        spec_checked(again)
        await client.responses.delete(created.id)
        with pytest.raises(openai.NotFoundError) as raised:
            await client.responses.retrieve(created.id)
    assert raised.value.status_code == 404
    assert raised.value.body["param"] == "response_id"  # type: ignore[index]


async def test_the_sdk_cancels_a_response_that_is_running() -> None:
    # The backend holds its answer after the first word until the end of the test.
    async with sdk(Reply(text="words that never all arrive", hold_at=2)) as (client, _, fake):
        stream = await client.responses.create(model=MODEL, input="Take your time.", stream=True)
        first = await anext(aiter(stream))
        await fake.wait_held()
        assert first.type == "response.created"
        response_id = first.response.id
        cancelled = await client.responses.cancel(response_id)
        rest = [event async for event in stream]
        assert cancelled.status == "cancelled"
        spec_checked(cancelled)
        assert rest[-1].type == "response.incomplete" and rest[-1].response.status == "cancelled"
        stored = await client.responses.retrieve(response_id)
    assert stored.status == "cancelled"


async def test_the_sdk_pages_through_input_items_with_its_cursor() -> None:
    messages = [{"role": "user", "content": f"message {n}"} for n in range(5)]
    async with sdk(Reply(text="read them")) as (client, _, _):
        response = await client.responses.create(model=MODEL, input=messages)  # type: ignore[arg-type]
        first = await client.responses.input_items.list(response.id, limit=2, order="asc")
        assert first.has_more and len(first.data) == 2
        texts = []
        async for item in client.responses.input_items.list(response.id, limit=2, order="asc"):
            texts.append(item.content[0].text)  # type: ignore[union-attr]
        newest = await client.responses.input_items.list(response.id, limit=1)
    assert texts == [f"message {n}" for n in range(5)]
    # The spec is silent on the default order: OpenAI's, newest first.
    assert newest.data[0].content[0].text == "message 4"  # type: ignore[union-attr]


async def test_the_sdk_holds_a_function_call_round_trip_with_previous_response_id() -> None:
    call = ScriptedToolCall(name="get_weather", arguments='{"city": "Paris"}')
    async with sdk(Reply(tool_calls=[call]), Reply(text="It is 21 degrees in Paris.")) as (client, _, fake):
        first = await client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER])  # type: ignore[list-item]
        calls = [item for item in first.output if item.type == "function_call"]
        assert first.status == "completed" and len(calls) == 1
        assert json.loads(calls[0].arguments) == {"city": "Paris"}
        spec_checked(first)
        second = await client.responses.create(
            model=MODEL,
            previous_response_id=first.id,
            tools=[WEATHER],  # type: ignore[list-item]
            input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"temp": 21}'}],
        )
    assert second.output_text == "It is 21 degrees in Paris."
    assert second.previous_response_id == first.id
    sent = fake.requests[-1].body["messages"]
    assert sent[-1] == {"role": "tool", "tool_call_id": calls[0].call_id, "content": '{"temp": 21}'}


async def test_the_sdk_streams_a_function_call_and_its_arguments() -> None:
    call = ScriptedToolCall(name="get_weather", arguments='{"city": "Oslo"}')
    async with sdk(Reply(tool_calls=[call])) as (client, _, _):
        stream = await client.responses.create(model=MODEL, input="Weather?", tools=[WEATHER], stream=True)  # type: ignore[list-item]
        events = [event async for event in stream]
    for event in events:
        assert_event_schema(event.model_dump(mode="json", exclude_unset=True))
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(done[0].arguments) == {"city": "Oslo"}
    assert events[-1].type == "response.completed"


@pytest.mark.parametrize(
    ("request_body", "param"),
    [
        ({"input": [{"type": "no_such_item"}]}, "input[0].type"),
        ({"input": "hi", "temperature": "hot"}, "temperature"),
        ({"input": "hi", "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"input": "hi", "tool_choice": {"type": "function", "name": "missing"}}, "tool_choice.name"),
        ({"input": [{"role": "wizard", "content": "hi"}]}, "input[0].role"),
    ],
)
async def test_a_bad_request_is_the_sdks_bad_request_error_naming_the_parameter(
    request_body: dict[str, object], param: str
) -> None:
    async with sdk(Reply(text="never")) as (client, _, _):
        with pytest.raises(openai.BadRequestError) as raised:
            await client.responses.create(model=MODEL, **request_body)  # type: ignore[arg-type, call-overload]
    assert raised.value.status_code == 400
    assert raised.value.param == param, raised.value.body
    assert_schema(raised.value.body, "ErrorPayload")


async def test_a_model_the_backend_does_not_serve_is_not_found() -> None:
    async with FakeOpenAI(Reply(text="x")) as fake:
        provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model=MODEL))
        provider.capabilities = dataclasses_replace_models(provider, {MODEL})
        try:
            async with running_doors(provider=provider, store=MemoryStore(), model=MODEL) as doors:
                client = openai.AsyncOpenAI(base_url=doors.base_url, api_key="unused", max_retries=0)
                with pytest.raises(openai.NotFoundError) as raised:
                    await client.responses.create(model="gpt-unknown", input="hi")
                await client.close()
        finally:
            await provider.aclose()
    assert raised.value.param == "model" and raised.value.code == "model_not_found"


def dataclasses_replace_models(provider: object, models: set[str]) -> object:
    import dataclasses

    from antwort_grpc.providers.base import capabilities_of

    return dataclasses.replace(capabilities_of(provider), models=frozenset(models))


async def test_a_cancel_of_a_finished_response_is_the_sdks_conflict_error() -> None:
    async with sdk(Reply(text="done")) as (client, _, _):
        response = await client.responses.create(model=MODEL, input="hi")
        with pytest.raises(openai.ConflictError) as raised:
            await client.responses.cancel(response.id)
    assert raised.value.code == "not_in_progress"


async def test_a_caller_over_the_gateways_limit_gets_the_sdks_rate_limit_error() -> None:
    async with FakeOpenAI(Reply(text="held", hold_at=1)) as fake:
        provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model=MODEL))
        try:
            async with running_doors(
                provider=provider, store=MemoryStore(), model=MODEL, max_running_responses=1
            ) as doors:
                client = openai.AsyncOpenAI(base_url=doors.base_url, api_key="unused", max_retries=0)
                holding = await client.responses.create(model=MODEL, input="hold", stream=True)
                await fake.wait_held()
                with pytest.raises(openai.RateLimitError) as raised:
                    await client.responses.create(model=MODEL, input="one too many")
                fake.release()
                assert [e async for e in holding][-1].type == "response.completed"
                await client.close()
        finally:
            await provider.aclose()
    assert raised.value.code == "too_many_running"
    assert raised.value.response.headers["retry-after"] == "1"


async def test_a_wrong_api_key_is_the_sdks_authentication_error_and_a_right_one_gets_in(tmp_path: Path) -> None:
    credentials = api_keys(tmp_path)
    async with FakeOpenAI(Reply(text="welcome")) as fake:
        provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model=MODEL))
        try:
            async with running_doors(
                provider=provider, store=MemoryStore(), model=MODEL, **credentials.settings
            ) as doors:
                wrong = openai.AsyncOpenAI(base_url=doors.base_url, api_key="not-a-key", max_retries=0)
                with pytest.raises(openai.AuthenticationError) as raised:
                    await wrong.responses.create(model=MODEL, input="hi")
                await wrong.close()
                right = openai.AsyncOpenAI(base_url=doors.base_url, api_key=credentials.tokens["alice"], max_retries=0)
                response = await right.responses.create(model=MODEL, input="hi")
                await right.close()
        finally:
            await provider.aclose()
    assert raised.value.status_code == 401 and raised.value.code == "unauthenticated"
    assert response.output_text == "welcome"


async def test_a_conversation_is_compacted_into_one_item_that_stands_for_it_as_input() -> None:
    summary = "The user is Alice; the launch is on Tuesday, support is told first."
    async with sdk(Reply(text="Noted."), Reply(text=summary), Reply(text="Tuesday.")) as (client, doors, fake):
        first = await client.responses.create(model=MODEL, input="I am Alice. We launch on Tuesday.")
        compacted = await client.post(
            "/responses/compact",
            cast_to=object,
            body={"model": MODEL, "previous_response_id": first.id, "input": "Support is told first."},
        )
        assert_schema(compacted, "CompactResource")
        (item,) = compacted["output"]  # type: ignore[index]
        assert item["type"] == "compaction"
        asked = fake.requests[-1].body["messages"]
        assert "Summarize the conversation" in asked[0]["content"]
        assert [m["content"] for m in asked[1:]] == [
            "I am Alice. We launch on Tuesday.",
            "Noted.",
            "Support is told first.",
        ]
        again = await client.responses.create(
            model=MODEL,
            input=[item, {"role": "user", "content": "When do we launch?"}],  # type: ignore[list-item]
        )
        assert again.output_text == "Tuesday."
        sent = fake.requests[-1].body["messages"]
        assert summary in sent[0]["content"] and sent[-1]["content"] == "When do we launch?"
        assert await doors.grpc.store.get(compacted["id"]) is None  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as raised:
            await client.responses.create(
                model=MODEL,
                input=[{"type": "compaction", "encrypted_content": "forged"}],  # type: ignore[list-item]
            )
    assert raised.value.param == "input[0].encrypted_content"


async def test_a_kept_conversation_is_compacted_and_left_as_it_was() -> None:
    summary = "The user is Alice; the launch is on Tuesday."
    async with sdk(Reply(text="Noted."), Reply(text=summary, times=2)) as (client, _, fake):
        conversation = await client.conversations.create(items=[{"role": "user", "content": "I am Alice."}])
        await client.responses.create(model=MODEL, input="We launch on Tuesday.", conversation=conversation.id)
        before = (await client.conversations.items.list(conversation.id, order="asc")).data
        # Not in OpenAI's compact body: here, the conversation's items are what is summarized.
        for named in (conversation.id, {"id": conversation.id}):
            compacted = await client.post(
                "/responses/compact", cast_to=object, body={"model": MODEL, "conversation": named}
            )
            assert_schema(compacted, "CompactResource")
            asked = fake.requests[-1].body["messages"]
            assert "Summarize the conversation" in asked[0]["content"]
            assert [m["content"] for m in asked[1:]] == ["I am Alice.", "We launch on Tuesday.", "Noted."]
        assert (await client.conversations.items.list(conversation.id, order="asc")).data == before
        with pytest.raises(openai.BadRequestError) as both:
            await client.post(
                "/responses/compact",
                cast_to=object,
                body={"model": MODEL, "conversation": conversation.id, "previous_response_id": "resp_1"},
            )
        assert both.value.param == "conversation"
        with pytest.raises(openai.NotFoundError) as unknown:
            await client.post("/responses/compact", cast_to=object, body={"model": MODEL, "conversation": "conv_1"})
        assert unknown.value.param == "conversation"
