"""The first turn's model stream starts before `created` is handed out, so the backend's round trip
overlaps the first writes. These drive the engine directly to pin what must still hold: the
response is stored before the model is asked, and a stream that is never read is closed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from antwort_grpc import pb
from antwort_grpc.engine import Engine
from antwort_grpc.providers.base import Completion, FinishReason, ProviderEvent, TextDelta, TurnEnd, TurnRequest
from antwort_grpc.storage.base import StoredResponse
from antwort_grpc.storage.memory import MemoryStore
from tests.harness import assert_valid_stream, user

S = pb.ResponseStatus


class CountingStore(MemoryStore):
    saves = 0

    async def save(self, record: StoredResponse) -> None:
        await super().save(record)
        self.saves += 1


class GatedProvider:
    """Streams "hello" once `release` is set; records when the stream starts and ends."""

    def __init__(self, store: CountingStore) -> None:
        self.store = store
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.closed = asyncio.Event()
        self.stored_when_asked: bool | None = None

    async def stream(self, turn: TurnRequest) -> AsyncIterator[ProviderEvent]:
        self.started.set()
        self.stored_when_asked = self.store.saves > 0
        try:
            await self.release.wait()
            yield TextDelta("hello")
            yield TurnEnd(FinishReason.STOP)
        finally:
            self.closed.set()

    async def complete(self, turn: TurnRequest) -> Completion:
        raise AssertionError("streaming only")


def streaming(text: str) -> pb.CreateResponseRequest:
    request = user(text)
    request.model = "m"
    request.stream = True
    return request


async def test_the_model_is_asked_before_created_is_read_and_after_the_save() -> None:
    store = CountingStore()
    provider = GatedProvider(store)
    events = Engine(provider, store).run(streaming("hi"))
    first = await anext(events)
    assert first.WhichOneof("event") == "created"
    await asyncio.wait_for(provider.started.wait(), 1)
    assert provider.stored_when_asked, "stored before the model is asked"
    provider.release.set()
    rest = [event async for event in events]
    assert_valid_stream([first, *rest])
    assert rest[-1].completed.response.output[0].message.content[0].output_text.text == "hello"


async def test_a_stop_before_the_first_turn_closes_the_early_stream() -> None:
    store = CountingStore()
    provider = GatedProvider(store)
    engine = Engine(provider, store)
    events = engine.run(streaming("hi"))
    first = await anext(events)
    await asyncio.wait_for(provider.started.wait(), 1)
    # Not interruptible yet (the caller holds `created`): only the flag is set.
    assert await engine.cancel(first.created.response.id)
    rest = [event async for event in events]
    assert_valid_stream([first, *rest])
    assert rest[-1].WhichOneof("event") == "cancelled"
    assert provider.closed.is_set(), "the model stream was closed, not left running"
    stored = await store.get(first.created.response.id)
    assert stored is not None and stored.response.status == S.RESPONSE_STATUS_CANCELLED


async def test_a_caller_that_goes_away_after_created_closes_the_early_stream() -> None:
    store = CountingStore()
    provider = GatedProvider(store)
    events = Engine(provider, store).run(streaming("hi"))
    first = await anext(events)
    await asyncio.wait_for(provider.started.wait(), 1)
    await events.aclose()  # type: ignore[attr-defined]
    assert provider.closed.is_set()
    stored = await store.get(first.created.response.id)
    assert stored is not None and stored.response.status == S.RESPONSE_STATUS_CANCELLED


async def test_a_deadline_while_the_first_delta_is_awaited_fails_the_response() -> None:
    store = CountingStore()
    provider = GatedProvider(store)
    events = [event async for event in Engine(provider, store).run(streaming("hi"), timeout=0.3)]
    assert_valid_stream(events)
    assert events[-1].failed.response.error.code == "deadline_exceeded"
    assert provider.closed.is_set()
