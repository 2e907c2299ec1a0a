"""Creates racing with one idempotency key, on a real gateway over each store (memory, a SQLite
file, a PostgreSQL database): every caller gets the one response, whatever moment it arrives in
(before the first create stored its response, before its event log began, while it runs, after),
and the model is asked once. A caller that comes too early may be told ABORTED
(`idempotency_key_pending`); the retry the docs give then finds the response. Never NOT_FOUND."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import pytest

from antwort_grpc import pb
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.storage.base import StoredResponse
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply
from tests.harness import GatewayClient, assert_valid_stream, collect, kind, response_of, running_gateway, user
from tests.http_harness import running_doors
from tests.storage.conftest import Backend
from tests.test_auth import reason_of

# Callers per race, and races per mode (each with a key of its own).
CALLERS = 8
RACES = 3
MODES = [(False, False), (False, True), (True, False), (True, True)]


class SlowFirstSave:
    """The store, with its first save of each response slowed: the window between binding a key
    and storing its response, which a racing caller falls into, made as wide as a slow database
    makes it (the race hit it without this in 2 of 5 trials, 5-48 ms after sending)."""

    def __init__(self, store: Any, delay: float) -> None:
        self._store = store
        self._delay = delay
        self._saved: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def save(self, record: StoredResponse) -> None:
        if record.response.id not in self._saved:
            self._saved.add(record.response.id)
            await asyncio.sleep(self._delay)
        await self._store.save(record)


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as backend:
        yield backend


async def create_until_found(gw: GatewayClient, request: pb.CreateResponseRequest, key: str) -> list[pb.StreamEvent]:
    """A create as a client following docs/durable-runs.md retries it: ABORTED and UNAVAILABLE
    again after a short wait, anything else is the answer."""
    delay = 0.02
    while True:
        try:
            return await collect(gw.stub.CreateResponse(request, metadata=(("idempotency-key", key),), timeout=30))
        except grpc.aio.AioRpcError as error:
            if error.code() not in (grpc.StatusCode.ABORTED, grpc.StatusCode.UNAVAILABLE):
                raise AssertionError(f"{error.code()}: {error.details()}") from None
            if error.code() == grpc.StatusCode.ABORTED:
                assert reason_of(error) == "idempotency_key_pending", error.details()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


async def race(
    gw: GatewayClient, fake: FakeOpenAI, key: str, *, background: bool, stream: bool
) -> list[list[pb.StreamEvent]]:
    fake.add(Reply(text="charged once", delay=0.01))
    before = len(fake.chat_requests)
    request = user(f"charge the card ({key})")
    request.background, request.stream = background, stream
    answers = await asyncio.gather(*(create_until_found(gw, request, key) for _ in range(CALLERS)))
    ids = {response_of(events[0]).id for events in answers}
    assert len(ids) == 1, f"{len(ids)} responses for one key"
    if background and stream:
        # Every caller reads the log from its start.
        for events in answers:
            assert_valid_stream(events)
            assert kind(events[-1]) == "completed"
    elif not background:
        # The caller that ran it read its stream; the others, its end (a plain run keeps no log).
        assert all(kind(events[-1]) == "completed" for events in answers)
    (response_id,) = ids
    await until_ended(gw, response_id)
    assert len(fake.chat_requests) - before == 1, "the model was asked more than once"
    return answers


async def until_ended(gw: GatewayClient, response_id: str) -> pb.Response:
    async with asyncio.timeout(20):
        while True:
            reply = await gw.stub.GetResponse(pb.GetResponseRequest(response_id=response_id))
            if reply.response.status not in (
                pb.ResponseStatus.RESPONSE_STATUS_QUEUED,
                pb.ResponseStatus.RESPONSE_STATUS_IN_PROGRESS,
            ):
                return reply.response  # type: ignore[no-any-return]
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("slow_save", [0.0, 0.2], ids=["as_is", "slow_first_save"])
async def test_concurrent_creates_with_one_key_all_get_the_one_response(
    backend: Backend, fake: FakeOpenAI, slow_save: float
) -> None:
    store = await backend.open(clock=time.time)
    served = SlowFirstSave(store, slow_save) if slow_save else store
    provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model="fake-model"))
    try:
        async with running_gateway(provider=provider, store=served) as gw:
            for background, stream in MODES:
                for n in range(RACES):
                    await race(gw, fake, f"k-{int(background)}{int(stream)}-{n}", background=background, stream=stream)
    finally:
        await provider.aclose()


async def post_until_found(session: aiohttp.ClientSession, url: str, body: dict[str, Any], key: str) -> str:
    """An HTTP create as docs/durable-runs.md retries it: 409 `idempotency_key_pending` again."""
    delay = 0.02
    while True:
        async with session.post(url, json=body, headers={"Idempotency-Key": key}) as reply:
            answer = await reply.json()
        if reply.status == 200:
            return str(answer["id"])
        assert reply.status == 409 and answer["error"]["code"] == "idempotency_key_pending", answer
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)


@pytest.mark.parametrize("background", [False, True], ids=["plain", "background"])
async def test_concurrent_http_creates_with_one_key_all_get_the_one_response(
    fake: FakeOpenAI, background: bool
) -> None:
    provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model="fake-model"))
    fake.add(Reply(text="charged once", delay=0.01))
    body = {"model": "fake-model", "input": "charge the card", "background": background}
    try:
        async with (
            running_doors(provider=provider, store=SlowFirstSave(MemoryStore(), 0.2)) as doors,
            aiohttp.ClientSession() as session,
        ):
            url = doors.base_url + "/responses"
            ids = await asyncio.gather(*(post_until_found(session, url, body, "http-key") for _ in range(CALLERS)))
            assert len(set(ids)) == 1
            await until_ended(doors.grpc, ids[0])
    finally:
        await provider.aclose()
    assert len(fake.chat_requests) == 1
