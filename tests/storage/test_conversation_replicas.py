"""Two gateways on one PostgreSQL database, each with its own store (pool, instance): a
conversation created on one is used and read on the other, and two responses ending at once on
the two replicas both keep their items, each block whole."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import openai

from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.storage.postgres import PostgresStore
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply
from tests.http_harness import Doors, running_doors
from tests.storage.conftest import empty_database

MODEL = "fake-model"


@asynccontextmanager
async def two_replicas(admin_url: str, fake: FakeOpenAI) -> AsyncIterator[list[openai.AsyncOpenAI]]:
    async with AsyncExitStack() as stack:
        url = await stack.enter_async_context(empty_database(admin_url))
        clients = []
        for _ in range(2):
            store = await PostgresStore.open(url)
            stack.push_async_callback(store.close)
            provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model=MODEL))
            stack.push_async_callback(provider.aclose)
            doors: Doors = await stack.enter_async_context(running_doors(provider=provider, store=store, model=MODEL))
            client = openai.AsyncOpenAI(base_url=doors.base_url, api_key="unused", max_retries=0)
            stack.push_async_callback(client.close)
            clients.append(client)
        yield clients


async def test_a_conversation_is_one_across_replicas_and_keeps_both_racing_responses(
    postgres_admin_url: str,
) -> None:
    fake = FakeOpenAI(Reply(text="Hello, Ada."), Reply(text="noted", times=2))
    async with fake, two_replicas(postgres_admin_url, fake) as (a, b):
        conversation = await a.conversations.create(
            items=[{"role": "user", "content": "I am Ada."}], metadata={"team": "x"}
        )
        assert (await b.conversations.retrieve(conversation.id)).metadata == {"team": "x"}
        greeted = await b.responses.create(model=MODEL, input="Greet me.", conversation=conversation.id)
        assert greeted.output_text == "Hello, Ada."
        assert [m["content"] for m in fake.chat_requests[-1]["messages"]] == ["I am Ada.", "Greet me."]
        first, second = await asyncio.gather(
            a.responses.create(model=MODEL, input="one", conversation=conversation.id),
            b.responses.create(model=MODEL, input="two", conversation=conversation.id),
        )
        items = (await a.conversations.items.list(conversation.id, order="asc", limit=100)).data
    texts = [_text(i) for i in items]
    assert texts[:3] == ["I am Ada.", "Greet me.", "Hello, Ada."]
    blocks = sorted([texts[3:5], texts[5:7]])
    assert blocks == [["one", "noted"], ["two", "noted"]] and len(texts) == 7
    assert {items[4].id, items[6].id} == {first.output[0].id, second.output[0].id}


def _text(item: object) -> str:
    content = getattr(item, "content", "")
    if isinstance(content, str):
        return content
    return "".join(getattr(part, "text", "") for part in content)


async def test_an_item_added_to_a_conversation_on_one_replica_is_referenced_on_the_other(
    postgres_admin_url: str,
) -> None:
    fake = FakeOpenAI(Reply(text="Hello, Ada."))
    async with fake, two_replicas(postgres_admin_url, fake) as (a, b):
        conversation = await a.conversations.create(items=[{"role": "user", "content": "I am Ada."}])
        (item,) = (await a.conversations.items.list(conversation.id)).data
        # On the other replica, in no conversation: the item comes from the store, not a's memory.
        greeted = await b.responses.create(
            model=MODEL,
            input=[{"type": "item_reference", "id": item.id}, {"role": "user", "content": "Greet me."}],  # type: ignore[list-item]
        )
        assert greeted.output_text == "Hello, Ada."
        assert [m["content"] for m in fake.chat_requests[-1]["messages"]] == ["I am Ada.", "Greet me."]
