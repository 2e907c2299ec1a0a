"""Streams over the HTTP door as a client reads them, against a real gateway on the fake
OpenAI-compatible backend: sequence numbers 1, 2, 3 … in what each client sees (the extension
events it did not ask for leave no gap), `starting_after` in that same numbering whichever
events the client asks for, extension events named with the slug prefix (`antwort:`), and error
types from the spec's table."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from antwort_grpc import pb
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.storage.options import StoreOptions
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply
from tests.harness import collect
from tests.http_harness import Doors, assert_event_schema, running_doors, sse_events

MODEL = "fake-model"
WORDS = "one two three four five six seven eight"
ALL = {"Antwort-Events": "all"}


@asynccontextmanager
async def doors(*replies: Reply) -> AsyncIterator[Doors]:
    async with FakeOpenAI(*replies) as fake:
        provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model=MODEL, max_retries=0))
        try:
            async with running_doors(provider=provider, store=MemoryStore(), model=MODEL) as running:
                yield running
        finally:
            await provider.aclose()


async def read(running: Doors, url: str, headers: dict[str, str] | None = None, **body: Any) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        if body:
            answer = session.post(running.url + url, json=body, headers=headers or {})
        else:
            answer = session.get(running.url + url, headers=headers or {})
        async with answer as response:
            assert response.status == 200, await response.text()
            return await sse_events(response)


def numbers(events: list[dict[str, Any]]) -> list[int]:
    return [e["sequence_number"] for e in events]


async def test_sequence_numbers_are_contiguous_in_what_each_client_sees() -> None:
    async with doors(Reply(text=WORDS), Reply(text=WORDS)) as running:
        plain = await read(running, "/v1/responses", model=MODEL, input="Count.", stream=True)
        extended = await read(running, "/v1/responses", ALL, model=MODEL, input="Count.", stream=True)
    assert numbers(plain) == list(range(1, len(plain) + 1))
    assert numbers(extended) == list(range(1, len(extended) + 1))
    ours = [e["type"] for e in extended if not e["type"].startswith("response.")]
    assert ours and all(kind.startswith("antwort:") for kind in ours), ours
    assert len(extended) > len(plain)
    for event in plain:
        assert_event_schema(event)


async def test_starting_after_counts_in_the_clients_numbering_whichever_events_it_asked_for() -> None:
    async with doors(Reply(text=WORDS)) as running:
        request = pb.CreateResponseRequest(model=MODEL, input_text="Count.", background=True)
        created = await collect(running.grpc.stub.CreateResponse(request))
        response_id = created[0].created.response.id
        url = f"/v1/responses/{response_id}?stream=true"
        whole = await read(running, url)  # reads to the end: the log is complete after it
        whole_extended = await read(running, url, ALL)
        for after in (1, 3, len(whole) - 1):
            rest = await read(running, f"{url}&starting_after={after}")
            assert rest == whole[after:], after
        for after in (2, 5):
            rest = await read(running, f"{url}&starting_after={after}", ALL)
            assert rest == whole_extended[after:], after
    assert numbers(whole) == list(range(1, len(whole) + 1))
    assert numbers(whole_extended) == list(range(1, len(whole_extended) + 1))
    assert whole[-1]["type"] == "response.completed"


async def test_another_replica_numbers_the_events_the_same_way() -> None:
    async with FakeOpenAI(Reply(text=WORDS)) as fake:
        provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model=MODEL, max_retries=0))
        first = MemoryStore(StoreOptions(instance_id="a"))
        second = MemoryStore(StoreOptions(instance_id="b"), first.database)
        try:
            async with (
                running_doors(provider=provider, store=first, model=MODEL) as a,
                running_doors(provider=provider, store=second, model=MODEL) as b,
            ):
                request = pb.CreateResponseRequest(model=MODEL, input_text="Count.", background=True)
                created = await collect(a.grpc.stub.CreateResponse(request))
                url = f"/v1/responses/{created[0].created.response.id}?stream=true"
                on_a = await read(a, url)  # to the end
                on_a_extended = await read(a, url, ALL)
                on_b = await read(b, f"{url}&starting_after=4")
                on_b_extended = await read(b, f"{url}&starting_after=4", ALL)
        finally:
            await provider.aclose()
    assert on_b == on_a[4:] and on_b_extended == on_a_extended[4:]
    assert on_b[-1]["type"] == "response.completed"


async def test_error_types_are_the_specs() -> None:
    async with doors() as running, aiohttp.ClientSession() as session:
        async with session.post(running.url + "/v1/responses", json={"model": MODEL, "input": 5}) as bad:
            invalid = await bad.json()
        async with session.get(running.url + "/v1/responses/resp_nothing") as missing:
            absent = await missing.json()
    assert invalid["error"]["type"] == "invalid_request" and invalid["error"]["param"] == "input"
    assert absent["error"]["type"] == "not_found"
