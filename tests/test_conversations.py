"""Conversations as a user meets them: the official OpenAI Python SDK over the HTTP door
(`client.conversations…`, `responses.create(conversation=…)`), the same over gRPC
(ConversationsService), owner scoping with API keys, and two responses racing in one
conversation. A real gateway on loopback ports, the fake OpenAI-compatible backend."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest

from antwort_grpc import pb
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply, ScriptedToolCall
from tests.auth_fixtures import api_keys
from tests.harness import final
from tests.http_harness import Doors, assert_schema, running_doors

MODEL = "fake-model"


@asynccontextmanager
async def gateway(*replies: Reply, **settings: Any) -> AsyncIterator[tuple[Doors, FakeOpenAI]]:
    async with FakeOpenAI(*replies) as fake:
        provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model=MODEL))
        try:
            async with running_doors(provider=provider, store=MemoryStore(), model=MODEL, **settings) as doors:
                yield doors, fake
        finally:
            await provider.aclose()


def sdk(doors: Doors, key: str = "unused") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=doors.base_url, api_key=key, max_retries=0)


def asked(fake: FakeOpenAI, n: int = -1) -> list[Any]:
    """The messages the backend was sent by the n-th model call."""
    return [m["content"] for m in fake.chat_requests[n]["messages"]]


async def test_the_sdk_keeps_a_conversation_its_responses_start_from_and_add_to() -> None:
    async with gateway(Reply(text="Paris."), Reply(text="About 2.1 million.")) as (doors, fake):
        client = sdk(doors)
        conversation = await client.conversations.create(
            items=[{"type": "message", "role": "user", "content": "I am planning a trip to France."}],
            metadata={"topic": "travel"},
        )
        assert conversation.object == "conversation" and conversation.metadata == {"topic": "travel"}
        first = await client.responses.create(model=MODEL, input="Its capital?", conversation=conversation.id)
        assert first.output_text == "Paris."
        assert first.conversation is not None and first.conversation.id == conversation.id
        # OpenAI's object form of the parameter.
        second = await client.responses.create(
            model=MODEL, input="How many people live there?", conversation={"id": conversation.id}
        )
        assert second.output_text == "About 2.1 million."
        assert asked(fake) == [
            "I am planning a trip to France.",
            "Its capital?",
            "Paris.",
            "How many people live there?",
        ]
        assert_schema(second.model_dump(mode="json", exclude_unset=True))
        # Newest first by default, as OpenAI; a cursor pages on.
        page = await client.conversations.items.list(conversation.id, limit=2)
        assert [_text(i) for i in page.data] == ["About 2.1 million.", "How many people live there?"]
        assert page.has_more and page.last_id == page.data[-1].id
        rest = await client.conversations.items.list(conversation.id, limit=10, after=page.last_id)
        assert [_text(i) for i in rest.data] == ["Paris.", "Its capital?", "I am planning a trip to France."]
        assert not rest.has_more
        oldest = await client.conversations.items.list(conversation.id, order="asc", limit=1)
        assert [_text(i) for i in oldest.data] == ["I am planning a trip to France."]
        await client.close()


WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


async def test_a_function_call_round_trip_continues_in_the_conversation() -> None:
    call = ScriptedToolCall(name="get_weather", arguments='{"city": "Paris"}')
    async with gateway(Reply(tool_calls=[call]), Reply(text="21 degrees.")) as (doors, fake):
        client = sdk(doors)
        conversation = await client.conversations.create()
        first = await client.responses.create(
            model=MODEL, input="Weather in Paris?", tools=[WEATHER], conversation=conversation.id
        )
        (called,) = [item for item in first.output if item.type == "function_call"]
        second = await client.responses.create(
            model=MODEL,
            tools=[WEATHER],
            conversation=conversation.id,
            input=[{"type": "function_call_output", "call_id": called.call_id, "output": '{"temp": 21}'}],
        )
        kinds = [i.type for i in (await client.conversations.items.list(conversation.id, order="asc")).data]
        await client.close()
    assert second.output_text == "21 degrees."
    sent = fake.chat_requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    assert sent[1]["tool_calls"][0]["id"] == called.call_id
    assert kinds == ["message", "function_call", "function_call_output", "message"]


async def test_a_background_response_in_a_conversation_is_in_it_once_it_reads_as_ended() -> None:
    async with gateway(Reply(text="Done later.")) as (doors, _):
        client = sdk(doors)
        conversation = await client.conversations.create()
        started = await client.responses.create(
            model=MODEL, input="Work on it.", background=True, conversation=conversation.id
        )
        async with asyncio.timeout(20):
            for _ in iter(int, 1):  # polled, as a client of a background response does
                done = await client.responses.retrieve(started.id)
                if done.status not in ("queued", "in_progress"):
                    break
                await asyncio.sleep(0.01)
        items = (await client.conversations.items.list(conversation.id, order="asc")).data
        await client.close()
    assert done.status == "completed" and done.conversation is not None
    assert [_text(i) for i in items] == ["Work on it.", "Done later."]


async def test_the_sdk_reads_updates_and_deletes_a_conversation_and_its_items() -> None:
    async with gateway() as (doors, _):
        client = sdk(doors)
        conversation = await client.conversations.create()
        got = await client.conversations.retrieve(conversation.id)
        assert got.id == conversation.id and got.created_at == conversation.created_at and got.metadata == {}
        updated = await client.conversations.update(conversation.id, metadata={"stage": "two"})
        assert updated.metadata == {"stage": "two"}
        added = await client.conversations.items.create(
            conversation.id,
            items=[
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "one"}]},
                {"type": "message", "role": "user", "content": "two"},
            ],
        )
        assert added.object == "list" and [_text(i) for i in added.data] == ["one", "two"]
        assert added.first_id == added.data[0].id and added.last_id == added.data[1].id
        item = await client.conversations.items.retrieve(added.data[1].id, conversation_id=conversation.id)
        assert _text(item) == "two"
        after = await client.conversations.items.delete(added.data[0].id, conversation_id=conversation.id)
        assert after.id == conversation.id
        left = await client.conversations.items.list(conversation.id)
        assert [_text(i) for i in left.data] == ["two"]
        with pytest.raises(openai.NotFoundError):
            await client.conversations.items.retrieve(added.data[0].id, conversation_id=conversation.id)
        deleted = await client.conversations.delete(conversation.id)
        assert deleted.deleted and deleted.id == conversation.id
        with pytest.raises(openai.NotFoundError) as gone:
            await client.conversations.retrieve(conversation.id)
        assert gone.value.code == "not_found"
        with pytest.raises(openai.NotFoundError) as unused:
            await client.responses.create(model=MODEL, input="hi", conversation=conversation.id)
        assert unused.value.body["param"] == "conversation"  # type: ignore[index]
        await client.close()


async def test_conversation_with_previous_response_id_is_refused_naming_the_parameter() -> None:
    async with gateway(Reply(text="first")) as (doors, fake):
        client = sdk(doors)
        conversation = await client.conversations.create()
        first = await client.responses.create(model=MODEL, input="hi")
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.create(
                model=MODEL, input="again", conversation=conversation.id, previous_response_id=first.id
            )
        await client.close()
    assert refused.value.status_code == 400
    assert refused.value.body["param"] == "conversation"  # type: ignore[index]
    assert "previous_response_id" in refused.value.message
    assert len(fake.chat_requests) == 1  # nothing started


async def test_bad_conversation_bodies_are_refused_naming_the_field() -> None:
    async with gateway() as (doors, _):
        client = sdk(doors)
        with pytest.raises(openai.BadRequestError) as too_many:
            await client.conversations.create(metadata={f"k{n}": "v" for n in range(17)})
        assert too_many.value.body["param"] == "metadata"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as no_items:
            await client.conversations.create(items=[{"type": "message", "role": "user", "content": []}])
        assert no_items.value.body["param"] == "items[0].content"  # type: ignore[index]
        conversation = await client.conversations.create()
        with pytest.raises(openai.BadRequestError) as empty:
            await client.conversations.items.create(conversation.id, items=[])
        assert empty.value.body["param"] == "items"  # type: ignore[index]
        await client.close()


async def test_over_grpc_a_conversation_is_the_same_resource_and_history() -> None:
    async with gateway(Reply(text="Noted, Ada.")) as (doors, fake):
        stub = pb.ConversationsServiceStub(doors.grpc.channel)
        hello = pb.Item(
            message=pb.Message(
                role=pb.Role.ROLE_USER, content=[pb.ContentPart(input_text=pb.InputText(text="I am Ada."))]
            )
        )
        created = await stub.CreateConversation(pb.CreateConversationRequest(items=[hello], metadata={"a": "b"}))
        conversation_id = created.conversation.id
        assert conversation_id.startswith("conv_") and created.conversation.metadata == {"a": "b"}
        response = final(
            await doors.grpc.stream(
                pb.CreateResponseRequest(input_text="Remember me.", conversation_id=conversation_id)
            )
        )
        assert response.conversation_id == conversation_id
        assert asked(fake) == ["I am Ada.", "Remember me."]
        listed = await stub.ListConversationItems(pb.ListConversationItemsRequest(conversation_id=conversation_id))
        # Over gRPC the default order is ASC, as ListInputItems.
        assert [i.WhichOneof("kind") for i in listed.items] == ["message"] * 3
        assert listed.items[-1].id == response.output[0].id and not listed.has_more
        # The same conversation over HTTP.
        client = sdk(doors)
        page = await client.conversations.items.list(conversation_id, order="asc")
        assert [i.id for i in page.data] == [i.id for i in listed.items]
        await client.close()
        with pytest.raises(grpc.aio.AioRpcError) as both:
            await doors.grpc.create(
                pb.CreateResponseRequest(
                    input_text="x", conversation_id=conversation_id, previous_response_id=response.id
                )
            )
        assert both.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        await stub.DeleteConversation(pb.DeleteConversationRequest(conversation_id=conversation_id))
        with pytest.raises(grpc.aio.AioRpcError) as gone:
            await stub.GetConversation(pb.GetConversationRequest(conversation_id=conversation_id))
        assert gone.value.code() == grpc.StatusCode.NOT_FOUND


async def test_another_owners_conversation_is_not_found_exactly_as_an_unknown_one(tmp_path: Path) -> None:
    credentials = api_keys(tmp_path)
    async with gateway(Reply(text="ok"), **credentials.settings) as (doors, fake):
        alice, bob = sdk(doors, credentials.tokens["alice"]), sdk(doors, credentials.tokens["bob"])
        conversation = await alice.conversations.create(
            items=[{"type": "message", "role": "user", "content": "alice's secret"}]
        )
        answers = []
        for conversation_id in (conversation.id, "conv_unknown"):
            with pytest.raises(openai.NotFoundError) as read:
                await bob.conversations.retrieve(conversation_id)
            with pytest.raises(openai.NotFoundError) as listed:
                await bob.conversations.items.list(conversation_id)
            with pytest.raises(openai.NotFoundError) as used:
                await bob.responses.create(model=MODEL, input="tell me", conversation=conversation_id)
            with pytest.raises(openai.NotFoundError):
                await bob.conversations.items.create(conversation_id, items=[{"role": "user", "content": "x"}])
            with pytest.raises(openai.NotFoundError):
                await bob.conversations.delete(conversation_id)
            answers.append(
                [
                    (e.value.body["code"], e.value.body["param"], e.value.message.replace(conversation_id, "ID"))  # type: ignore[index]
                    for e in (read, listed, used)
                ]
            )
        assert answers[0] == answers[1]
        stub = pb.ConversationsServiceStub(doors.grpc.channel)
        with pytest.raises(grpc.aio.AioRpcError) as over_grpc:
            await stub.GetConversation(
                pb.GetConversationRequest(conversation_id=conversation.id), metadata=credentials.of("bob")
            )
        assert over_grpc.value.code() == grpc.StatusCode.NOT_FOUND
        # Alice's conversation is untouched, and hers to use.
        assert (await alice.conversations.retrieve(conversation.id)).id == conversation.id
        assert not fake.chat_requests
        await alice.close()
        await bob.close()


async def test_two_responses_at_once_in_one_conversation_both_keep_their_items_in_order() -> None:
    async with gateway(Reply(text="answer", times=2)) as (doors, _):
        client = sdk(doors)
        conversation = await client.conversations.create()
        first, second = await asyncio.gather(
            client.responses.create(model=MODEL, input="question one", conversation=conversation.id),
            client.responses.create(model=MODEL, input="question two", conversation=conversation.id),
        )
        items = (await client.conversations.items.list(conversation.id, order="asc")).data
        await client.close()
    assert first.status == second.status == "completed"
    asked_by = {first.output[0].id: "question one", second.output[0].id: "question two"}
    # Each response's input, then its output: two whole blocks, one after the other.
    assert len(items) == 4
    for question, answer in (items[0:2], items[2:4]):
        assert _text(answer) == "answer" and asked_by[answer.id] == _text(question)
    assert {items[1].id, items[3].id} == set(asked_by)


def _text(item: Any) -> str:
    content = item.content
    if isinstance(content, str):
        return content
    return "".join(getattr(part, "text", "") for part in content)


async def test_an_item_added_to_a_conversation_can_be_referenced_by_a_create_that_continues_it() -> None:
    async with gateway(Reply(text="Noted.")) as (doors, fake):
        client = sdk(doors)
        conversation = await client.conversations.create()
        added = await client.conversations.items.create(
            conversation.id, items=[{"type": "message", "role": "user", "content": "My name is Ada."}]
        )
        reference = {"type": "item_reference", "id": added.data[0].id}
        answer = await client.responses.create(
            model=MODEL,
            input=[reference, {"role": "user", "content": "Say hi."}],  # type: ignore[list-item]
            conversation=conversation.id,
        )
        assert answer.output_text == "Noted."
        assert asked(fake)[-2:] == ["My name is Ada.", "Say hi."]
        # An id the conversation does not hold is still not found, naming the field.
        with pytest.raises(openai.NotFoundError) as raised:
            await client.responses.create(
                model=MODEL,
                input=[{"type": "item_reference", "id": "msg_nowhere"}],  # type: ignore[list-item]
                conversation=conversation.id,
            )
        assert raised.value.body["param"] == "input[0].id"  # type: ignore[index]


async def test_a_create_in_a_conversation_needs_no_input_of_its_own() -> None:
    async with gateway(Reply(text="Hello, Ada.")) as (doors, fake):
        client = sdk(doors)
        conversation = await client.conversations.create()
        await client.conversations.items.create(conversation.id, items=[{"role": "user", "content": "I am Ada."}])
        # OpenAI's pattern: items added to the conversation, then a response to them.
        answer = await client.responses.create(model=MODEL, conversation=conversation.id)
        assert answer.output_text == "Hello, Ada."
        assert asked(fake) == ["I am Ada."]
        items = (await client.conversations.items.list(conversation.id, order="asc")).data
        assert [_text(i) for i in items] == ["I am Ada.", "Hello, Ada."]
        # Without a conversation (or an earlier response) input is still required.
        with pytest.raises(openai.BadRequestError) as raised:
            await client.responses.create(model=MODEL)
        assert raised.value.param == "input"
        await client.close()
