"""Durable runs over the HTTP door, driven by the official OpenAI Python SDK against a real gateway
on the fake OpenAI-compatible backend: background creates polled with `retrieve`, a dropped
background stream read on with `retrieve(id, stream=True, starting_after=N)`, cancel, the
`Idempotency-Key` header (the same key as the gRPC door's `idempotency-key` metadata), the errors,
and a response created over gRPC read on over HTTP. The events read on are checked against the
gRPC door's AttachResponse of the same log, and that log with the harness's stream validator."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from antwort_grpc import pb
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.storage.options import StoreOptions
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply
from tests.auth_fixtures import api_keys
from tests.harness import assert_valid_stream, collect, kinds
from tests.http_harness import Doors, assert_event_schema, assert_schema, running_doors
from tests.storage.conftest import FakeClock

MODEL = "fake-model"
WORDS = "one two three four five six seven eight nine ten"
# The SDK's event types of the spec events our engine's lifecycle kinds become.
RUNNING = ("queued", "in_progress")


@asynccontextmanager
async def sdk(*replies: Reply, **gateway: Any) -> AsyncIterator[tuple[openai.AsyncOpenAI, Doors, FakeOpenAI]]:
    async with FakeOpenAI(*replies) as fake:
        provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model=MODEL))
        gateway.setdefault("store", MemoryStore())
        try:
            async with running_doors(provider=provider, model=MODEL, **gateway) as doors:
                # No retries: a test sees the first answer the gateway gives.
                client = openai.AsyncOpenAI(base_url=doors.base_url, api_key="unused", max_retries=0)
                try:
                    yield client, doors, fake
                finally:
                    await client.close()
        finally:
            await provider.aclose()


async def poll_until_ended(client: openai.AsyncOpenAI, response_id: str) -> openai.types.responses.Response:
    async with asyncio.timeout(20):
        while True:
            response = await client.responses.retrieve(response_id)
            if response.status not in RUNNING:
                return response
            await asyncio.sleep(0.02)


async def grpc_log(doors: Doors, response_id: str, after: int = 0) -> list[pb.StreamEvent]:
    """The response's events as the gRPC door's AttachResponse reads them."""
    request = pb.AttachResponseRequest(response_id=response_id, starting_after=after)
    return await collect(doors.grpc.stub.AttachResponse(request, timeout=20))


async def no_connections(doors: Doors) -> None:
    """Returns once the HTTP door holds no client connection (a client that closed its stream is gone)."""
    assert doors.door.runner is not None and doors.door.runner.server is not None
    server = doors.door.runner.server
    async with asyncio.timeout(10):
        while True:
            if not server.connections:
                return
            await asyncio.sleep(0.01)


def dumped(event: Any) -> dict[str, Any]:
    body: dict[str, Any] = event.model_dump(mode="json", exclude_unset=True)
    return body


async def test_a_background_create_answers_at_once_and_polling_retrieve_sees_it_complete() -> None:
    async with sdk(Reply(text="Done in the background.", hold_at=2)) as (client, _, fake):
        started = await client.responses.create(model=MODEL, input="Work on it.", background=True)
        # Answered while the backend still holds its answer: the run is not done.
        assert started.status in RUNNING and started.background is True
        assert_schema(dumped(started))
        await fake.wait_held()
        fake.release()
        done = await poll_until_ended(client, started.id)
    assert done.status == "completed" and done.output_text == "Done in the background."
    assert done.background is True
    assert len(fake.chat_requests) == 1


async def test_a_dropped_background_stream_goes_on_and_retrieve_streams_every_later_event_once() -> None:
    async with sdk(Reply(text=WORDS, hold_at=4)) as (client, doors, fake):
        stream = await client.responses.create(model=MODEL, input="Count.", background=True, stream=True)
        read = []
        async for event in stream:
            read.append(event)
            if len(read) == 4:
                break
        await fake.wait_held()
        # The client goes away while the run is held mid-answer; only then does the run go on.
        await stream.close()
        await no_connections(doors)
        fake.release()
        response_id = read[0].response.id  # type: ignore[union-attr]
        after = read[-1].sequence_number
        again = await client.responses.retrieve(response_id, stream=True, starting_after=after)
        rest = [event async for event in again]
        log = await grpc_log(doors, response_id)
    assert read[0].type == "response.created" and read[0].response.background is True  # type: ignore[union-attr]
    assert rest[-1].type == "response.completed" and rest[-1].response.status == "completed"
    for event in [*read, *rest]:
        assert_event_schema(dumped(event))
    # Every later event exactly once, in order: the gRPC door's log of the same run, its spec
    # events (ours are only sent on request), numbered 1, 2, 3 … as this client sees them: the
    # client's `starting_after` counts in that numbering.
    assert_valid_stream(log)
    spec_events = [e for e in log if kinds([e])[0] not in OURS]
    assert [e.type for e in [*read, *rest]] == [_spec_type(e) for e in spec_events]
    assert [e.sequence_number for e in [*read, *rest]] == list(range(1, len(spec_events) + 1))
    assert "".join(e.delta for e in [*read, *rest] if e.type == "response.output_text.delta") == WORDS  # type: ignore[union-attr]
    assert len(fake.chat_requests) == 1


def _spec_type(event: pb.StreamEvent) -> str:
    from antwort_grpc.http.mapping import event_json

    body = event_json(event)
    assert body is not None
    return str(body["type"])


# Events of ours the door leaves out unless asked (`Antwort-Events: all`).
OURS = {"turn_started", "turn_decided", "turn_completed"}


async def test_retrieve_stream_after_the_end_replays_the_whole_log_with_our_events_on_request() -> None:
    async with sdk(Reply(text=WORDS)) as (client, doors, _):
        started = await client.responses.create(model=MODEL, input="Count.", background=True)
        await poll_until_ended(client, started.id)
        replay = await client.responses.retrieve(started.id, stream=True, extra_headers={"Antwort-Events": "all"})
        events = [event async for event in replay]
        log = await grpc_log(doors, started.id)
    assert [e.sequence_number for e in events] == [e.sequence_number for e in log]
    assert events[-1].type == "response.completed"


async def test_cancelling_a_background_run_twice_returns_the_cancelled_response() -> None:
    async with sdk(Reply(text=WORDS, hold_at=2)) as (client, doors, fake):
        started = await client.responses.create(model=MODEL, input="Take long.", background=True)
        await fake.wait_held()
        first = await client.responses.cancel(started.id)
        again = await client.responses.cancel(started.id)
        stored = await client.responses.retrieve(started.id)
        log = await grpc_log(doors, started.id)
        fake.release()
    assert first.status == "cancelled" and first.background is True
    assert dumped(again) == dumped(first)
    assert stored.status == "cancelled"
    assert_valid_stream(log)
    assert kinds(log)[-1] == "cancelled"


async def test_a_retried_create_with_the_same_idempotency_key_is_one_response_and_one_backend_request() -> None:
    async with sdk(Reply(text="charged once")) as (client, _, fake):
        key = {"Idempotency-Key": "order-7f3a"}
        first = await client.responses.create(model=MODEL, input="Charge the card.", background=True, extra_headers=key)
        again = await client.responses.create(model=MODEL, input="Charge the card.", background=True, extra_headers=key)
        done = await poll_until_ended(client, first.id)
        # Read the other way (streamed), the retry reads the first run's log from its start.
        streamed = await client.responses.create(
            model=MODEL, input="Charge the card.", background=True, stream=True, extra_headers=key
        )
        events = [event async for event in streamed]
    assert again.id == first.id and done.output_text == "charged once"
    assert events[0].type == "response.created" and events[0].response.id == first.id  # type: ignore[union-attr]
    assert events[-1].type == "response.completed"
    assert len(fake.chat_requests) == 1


async def test_a_retried_plain_create_with_the_same_idempotency_key_returns_the_first_ones_response() -> None:
    async with sdk(Reply(text="said once")) as (client, _, fake):
        key = {"Idempotency-Key": "plain-1"}
        first = await client.responses.create(model=MODEL, input="Say it.", extra_headers=key)
        again = await client.responses.create(model=MODEL, input="Say it.", extra_headers=key)
    assert first.status == "completed" and again.id == first.id and again.output_text == "said once"
    assert first.background is False
    assert len(fake.chat_requests) == 1


async def test_the_same_idempotency_key_over_grpc_and_http_is_the_same_response() -> None:
    async with sdk(Reply(text="one run")) as (client, doors, fake):
        request = pb.CreateResponseRequest(model=MODEL, input_text="Once.", background=True)
        created = await collect(doors.grpc.stub.CreateResponse(request, metadata=(("idempotency-key", "both-doors"),)))
        response_id = created[0].created.response.id
        over_http = await client.responses.create(
            model=MODEL, input="Once.", background=True, extra_headers={"Idempotency-Key": "both-doors"}
        )
        await poll_until_ended(client, response_id)
    assert over_http.id == response_id
    assert len(fake.chat_requests) == 1


@pytest.mark.parametrize(
    ("body", "headers", "status", "param", "code"),
    [
        ({"background": True, "store": False}, {}, 400, "background", None),
        ({"background": "yes"}, {}, 400, "background", None),
        ({}, {"Idempotency-Key": "has space"}, 400, "idempotency-key", None),
        ({"store": False}, {"Idempotency-Key": "k-1"}, 400, "idempotency-key", None),
    ],
)
async def test_a_bad_durable_create_is_an_error_object_naming_its_parameter(
    body: dict[str, Any], headers: dict[str, str], status: int, param: str, code: str | None
) -> None:
    async with sdk(Reply(text="never")) as (client, _, fake):
        with pytest.raises(openai.APIStatusError) as raised:
            await client.responses.create(model=MODEL, input="hi", extra_headers=headers, **body)
        assert fake.chat_requests == []
    assert raised.value.status_code == status
    assert raised.value.body["param"] == param, raised.value.body  # type: ignore[index]
    assert_schema(raised.value.body, "ErrorPayload")


async def test_the_same_idempotency_key_with_another_request_is_a_conflict_naming_the_key() -> None:
    async with sdk(Reply(text="first")) as (client, _, _):
        key = {"Idempotency-Key": "k-1"}
        first = await client.responses.create(model=MODEL, input="one", background=True, extra_headers=key)
        with pytest.raises(openai.ConflictError) as raised:
            await client.responses.create(model=MODEL, input="two", background=True, extra_headers=key)
    assert raised.value.code == "idempotency_key_reused" and first.id in raised.value.message


async def test_streaming_a_response_again_refuses_what_it_cannot_read() -> None:
    async with sdk(Reply(text=WORDS), Reply(text="plain")) as (client, doors, _):
        started = await client.responses.create(model=MODEL, input="Count.", background=True)
        await poll_until_ended(client, started.id)
        plain = await client.responses.create(model=MODEL, input="Not in background.")
        with pytest.raises(openai.NotFoundError) as unknown:
            await client.responses.retrieve("resp_nosuchresponse", stream=True)
        with pytest.raises(openai.BadRequestError) as beyond:
            await client.responses.retrieve(started.id, stream=True, starting_after=10_000)
        with pytest.raises(openai.BadRequestError) as negative:
            await client.responses.retrieve(started.id, stream=True, starting_after=-1)
        with pytest.raises(openai.ConflictError) as not_background:
            await client.responses.retrieve(plain.id, stream=True)
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{doors.url}/v1/responses/{started.id}?stream=true&starting_after=x") as answer,
        ):
            not_a_number = answer.status, await answer.json()
    assert unknown.value.status_code == 404 and unknown.value.body["param"] == "response_id"  # type: ignore[index]
    assert beyond.value.param == "starting_after" and beyond.value.code == "out_of_range"
    assert "last event of the log" in beyond.value.message
    assert negative.value.param == "starting_after" and negative.value.code == "invalid_request"
    assert not_a_number[0] == 400 and not_a_number[1]["error"]["param"] == "starting_after"
    assert not_background.value.code == "event_log_unavailable" and "final response" in not_background.value.message
    for raised in (unknown, beyond, negative, not_background):
        assert_schema(raised.value.body, "ErrorPayload")


async def test_an_expired_event_log_is_a_conflict_saying_the_final_response_is_what_is_left() -> None:
    clock = FakeClock()
    store = MemoryStore(StoreOptions(clock=clock))
    async with sdk(Reply(text="kept a minute"), store=store, background_log_retention_seconds=60) as (client, _, _):
        started = await client.responses.create(model=MODEL, input="x", background=True)
        await poll_until_ended(client, started.id)
        clock.advance(61)
        with pytest.raises(openai.ConflictError) as raised:
            await client.responses.retrieve(started.id, stream=True)
        still = await client.responses.retrieve(started.id)
    assert raised.value.code == "event_log_unavailable"
    assert "expired" in raised.value.message and "final response" in raised.value.message
    assert still.output_text == "kept a minute"


async def test_a_background_response_created_over_grpc_is_read_on_over_http_by_its_owner_only(tmp_path: Path) -> None:
    credentials = api_keys(tmp_path)
    async with sdk(Reply(text=WORDS), **credentials.settings) as (_, doors, _):
        request = pb.CreateResponseRequest(model=MODEL, input_text="Count.", background=True)
        created = await collect(doors.grpc.stub.CreateResponse(request, metadata=credentials.of("alice")))
        response_id = created[0].created.response.id
        alice = openai.AsyncOpenAI(base_url=doors.base_url, api_key=credentials.tokens["alice"], max_retries=0)
        bob = openai.AsyncOpenAI(base_url=doors.base_url, api_key=credentials.tokens["bob"], max_retries=0)
        try:
            events = [e async for e in await alice.responses.retrieve(response_id, stream=True, starting_after=2)]
            with pytest.raises(openai.NotFoundError):
                await bob.responses.retrieve(response_id, stream=True)
            with pytest.raises(openai.NotFoundError):
                await bob.responses.cancel(response_id)
        finally:
            await alice.close()
            await bob.close()
    assert events[0].sequence_number > 2 and events[-1].type == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == WORDS  # type: ignore[union-attr]


async def test_the_sdks_stream_helper_runs_in_background_and_resumes_by_response_id() -> None:
    async with sdk(Reply(text=WORDS, hold_at=4)) as (client, doors, fake):
        async with client.responses.stream(model=MODEL, input="Count.", background=True) as stream:
            read = []
            async for event in stream:
                read.append(event)
                if len(read) == 4:
                    break
        await fake.wait_held()
        await no_connections(doors)
        fake.release()
        response_id = read[0].response.id  # type: ignore[union-attr]
        after = read[-1].sequence_number
        async with client.responses.stream(response_id=response_id, starting_after=after) as resumed:
            rest = [event async for event in resumed]
            final = await resumed.get_final_response()
    assert [e.sequence_number for e in rest] == sorted({e.sequence_number for e in rest})
    assert rest[0].sequence_number > after and rest[-1].type == "response.completed"
    assert final.id == response_id and final.output_text == WORDS


async def test_a_background_run_holds_its_callers_slot_until_it_ends_and_reading_it_again_takes_none() -> None:
    async with sdk(Reply(text=WORDS, hold_at=2), Reply(text="next"), max_concurrent_responses=1) as (client, _, fake):
        started = await client.responses.create(model=MODEL, input="Count.", background=True)
        await fake.wait_held()
        with pytest.raises(openai.RateLimitError) as refused:
            await client.responses.create(model=MODEL, input="More.", background=True)
        assert refused.value.code == "too_many_responses"
        # Streaming it again reads the run that holds the slot: let in.
        reading = await client.responses.retrieve(started.id, stream=True)
        fake.release()
        events = [event async for event in reading]
        assert events[-1].type == "response.completed"
        # The run gave its slot back before its last event reached the log.
        after = await client.responses.create(model=MODEL, input="After.")
    assert after.output_text == "next"
