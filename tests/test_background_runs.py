"""Background responses, re-attaching and idempotency keys on one gateway (the memory store and
the fake OpenAI-compatible backend); replicas and crashes are in tests/storage/test_durable_runs.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from antwort_grpc import pb
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.storage.options import StoreOptions
from antwort_grpc.storage.runlog_memory import MemoryRunLog
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply
from tests.auth_fixtures import api_keys
from tests.harness import (
    GatewayClient,
    assert_valid_reattachment,
    assert_valid_stream,
    collect,
    events_of,
    function_tool,
    kind,
    kinds,
    output_text,
    response_of,
    running_gateway,
    user,
)
from tests.storage.conftest import FakeClock
from tests.test_auth import reason_of
from tests.test_interactive_runs import Session, approval, needs_approval, steer

S = pb.ResponseStatus
SLOW = Reply(text="word " * 60, delay=0.02)


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as backend:
        yield backend


@pytest.fixture
async def gw(fake: FakeOpenAI) -> AsyncIterator[GatewayClient]:
    provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model="fake-model"))
    async with running_gateway(provider=provider, store=MemoryStore()) as client:
        yield client
    await provider.aclose()


def background(text: str, *, stream: bool = False) -> pb.CreateResponseRequest:
    request = user(text)
    request.background = True
    request.stream = stream
    return request


async def poll_until_ended(gw: GatewayClient, response_id: str) -> pb.Response:
    async with asyncio.timeout(20):
        while True:
            reply = await gw.stub.GetResponse(pb.GetResponseRequest(response_id=response_id))
            if reply.response.status not in (S.RESPONSE_STATUS_QUEUED, S.RESPONSE_STATUS_IN_PROGRESS):
                return reply.response  # type: ignore[no-any-return]
            await asyncio.sleep(0.02)


async def attach(gw: GatewayClient, response_id: str, after: int = 0) -> list[pb.StreamEvent]:
    request = pb.AttachResponseRequest(response_id=response_id, starting_after=after)
    return await collect(gw.stub.AttachResponse(request, timeout=20))


async def status_of(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await collect(call)
    return raised.value


async def test_a_background_create_returns_at_once_in_progress_and_completes(
    fake: FakeOpenAI, gw: GatewayClient
) -> None:
    fake.add(Reply(text="Done in the background.", first_delay=0.3))
    messages = await collect(gw.stub.CreateResponse(background("work")))
    assert kinds(messages) == ["created"]
    started = response_of(messages[0])
    assert started.status in (S.RESPONSE_STATUS_QUEUED, S.RESPONSE_STATUS_IN_PROGRESS)
    done = await poll_until_ended(gw, started.id)
    assert done.status == S.RESPONSE_STATUS_COMPLETED
    assert output_text(done) == "Done in the background."


async def test_dropping_a_background_stream_does_not_cancel_it_and_attach_reads_the_rest(
    fake: FakeOpenAI, gw: GatewayClient
) -> None:
    fake.add(SLOW)
    call = gw.stub.CreateResponse(background("talk", stream=True))
    seen: list[pb.StreamEvent] = []
    async for message in call:
        seen.append(message.event)
        if len(seen) == 8:
            break
    call.cancel()
    rest = await attach(gw, response_of(seen[0]).id, after=8)
    assert_valid_reattachment(seen, 8, rest)
    assert response_of(rest[-1]).status == S.RESPONSE_STATUS_COMPLETED
    # After the end, within retention, the whole log is still there.
    assert await attach(gw, response_of(seen[0]).id) == seen + rest


async def test_a_batched_attach_replays_the_same_events_in_far_fewer_messages(
    fake: FakeOpenAI, gw: GatewayClient
) -> None:
    fake.add(SLOW)  # 60 words a little apart: a delta event each
    created = await collect(gw.stub.CreateResponse(background("talk")))
    response_id = response_of(created[0]).id
    await poll_until_ended(gw, response_id)
    one_each = [m async for m in gw.stub.AttachResponse(pb.AttachResponseRequest(response_id=response_id))]
    request = pb.AttachResponseRequest(response_id=response_id, batch_events=True)
    batched = [events_of(m) async for m in gw.stub.AttachResponse(request)]
    assert all(m.HasField("event") and not m.events for m in one_each)
    replayed = [event for message in batched for event in message]
    assert replayed == [m.event for m in one_each]
    assert_valid_stream(replayed)
    assert len(one_each) > 60 and len(batched) == 1, "the log read in one page leaves in one message"
    # From a sequence number on, the same: only what comes after it.
    request.starting_after = 10
    rest = [event async for m in gw.stub.AttachResponse(request) for event in events_of(m)]
    assert rest == replayed[10:]


async def test_a_batched_background_stream_follows_the_run_in_batches_and_attach_reads_on(
    fake: FakeOpenAI, gw: GatewayClient
) -> None:
    fake.add(SLOW)
    request = background("talk", stream=True)
    request.batch_events = True
    sent = [events_of(m) async for m in gw.stub.CreateResponse(request)]
    streamed = [event for message in sent for event in message]
    assert_valid_stream(streamed)
    assert kind(streamed[-1]) == "completed"
    assert len(sent) < len(streamed), "events appended to the log together leave together"
    attach_request = pb.AttachResponseRequest(response_id=response_of(streamed[0]).id, batch_events=True)
    assert [e async for m in gw.stub.AttachResponse(attach_request) for e in events_of(m)] == streamed


async def test_cancel_stops_a_background_run_and_cancelling_again_returns_it(
    fake: FakeOpenAI, gw: GatewayClient
) -> None:
    fake.add(Reply(text="word " * 400, delay=0.02))
    started = response_of((await collect(gw.stub.CreateResponse(background("long"))))[0])
    first = await gw.stub.CancelResponse(pb.CancelResponseRequest(response_id=started.id))
    assert first.response.status == S.RESPONSE_STATUS_CANCELLED
    again = await gw.stub.CancelResponse(pb.CancelResponseRequest(response_id=started.id))
    assert again.response == first.response
    events = await attach(gw, started.id)
    assert_valid_stream(events)
    assert kinds(events)[-1] == "cancelled"


async def test_background_without_store_is_invalid(gw: GatewayClient) -> None:
    request = background("x")
    request.store = False
    error = await status_of(gw.stub.CreateResponse(request))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "background" in (error.details() or "")


async def test_attach_to_an_unknown_response_is_not_found(gw: GatewayClient) -> None:
    error = await status_of(gw.stub.AttachResponse(pb.AttachResponseRequest(response_id="resp_nope")))
    assert error.code() == grpc.StatusCode.NOT_FOUND


async def test_attach_beyond_the_log_is_out_of_range(fake: FakeOpenAI, gw: GatewayClient) -> None:
    fake.add(Reply(text="short"))
    started = response_of((await collect(gw.stub.CreateResponse(background("x"))))[0])
    await poll_until_ended(gw, started.id)
    events = await attach(gw, started.id)
    error = await status_of(
        gw.stub.AttachResponse(pb.AttachResponseRequest(response_id=started.id, starting_after=len(events) + 1))
    )
    assert error.code() == grpc.StatusCode.OUT_OF_RANGE
    assert str(len(events)) in (error.details() or "")


async def test_attach_to_a_response_that_was_not_background_says_only_the_final_response_is_left(
    fake: FakeOpenAI, gw: GatewayClient
) -> None:
    fake.add(Reply(text="plain"))
    done = await gw.create(user("plain"))
    error = await status_of(gw.stub.AttachResponse(pb.AttachResponseRequest(response_id=done.id)))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "GetResponse" in (error.details() or "")


async def test_a_retried_create_with_the_same_idempotency_key_is_one_response_and_one_backend_request(
    fake: FakeOpenAI, gw: GatewayClient
) -> None:
    fake.add(Reply(text="once"))
    key = (("idempotency-key", "order-7f3a"),)
    request = background("charge the card")
    first = await collect(gw.stub.CreateResponse(request, metadata=key))
    second = await collect(gw.stub.CreateResponse(request, metadata=key))
    response_id = response_of(first[0]).id
    assert response_of(second[0]).id == response_id
    done = await poll_until_ended(gw, response_id)
    streamed = pb.CreateResponseRequest()
    streamed.CopyFrom(request)
    streamed.stream = True
    replayed = await collect(gw.stub.CreateResponse(streamed, metadata=key))
    assert_valid_stream(replayed)
    assert response_of(replayed[-1]) == done
    assert len(fake.chat_requests) == 1


async def test_a_streamed_create_with_an_idempotency_key_batches_its_events_when_asked(
    fake: FakeOpenAI, gw: GatewayClient
) -> None:
    fake.add(Reply(text="Charged."))
    request = user("charge the card")
    request.stream, request.batch_events = True, True
    sent = [events_of(m) async for m in gw.stub.CreateResponse(request, metadata=(("idempotency-key", "k-1"),))]
    events = [event for message in sent for event in message]
    assert_valid_stream(events)
    assert kinds(sent[0]) == ["created", "in_progress", "turn_started"]
    assert kind(events[-1]) == "completed" and len(sent) < len(events)


async def test_the_same_idempotency_key_with_another_request_is_refused_naming_the_key(
    fake: FakeOpenAI, gw: GatewayClient
) -> None:
    fake.add(Reply(text="once"))
    key = (("idempotency-key", "k-1"),)
    await collect(gw.stub.CreateResponse(background("one"), metadata=key))
    error = await status_of(gw.stub.CreateResponse(background("two"), metadata=key))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "'k-1'" in (error.details() or "")


async def test_a_malformed_idempotency_key_is_invalid(gw: GatewayClient) -> None:
    error = await status_of(gw.stub.CreateResponse(background("x"), metadata=(("idempotency-key", "has space"),)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "idempotency-key" in (error.details() or "")


async def test_a_retried_plain_create_with_a_key_returns_the_first_ones_final_response(
    fake: FakeOpenAI, gw: GatewayClient
) -> None:
    fake.add(Reply(text="the answer"))
    key = (("idempotency-key", "plain-1"),)
    request = user("question")
    first = await collect(gw.stub.CreateResponse(request, metadata=key))
    second = await collect(gw.stub.CreateResponse(request, metadata=key))
    assert response_of(second[0]) == response_of(first[0])
    assert len(fake.chat_requests) == 1


async def test_an_expired_event_log_says_what_is_left(fake: FakeOpenAI) -> None:
    clock = FakeClock()
    provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model="fake-model"))
    store = MemoryStore(StoreOptions(clock=clock))
    async with running_gateway(provider=provider, store=store, background_log_retention_seconds=60) as gw:
        fake.add(Reply(text="kept a minute"))
        started = response_of((await collect(gw.stub.CreateResponse(background("x"))))[0])
        await poll_until_ended(gw, started.id)
        clock.advance(59)
        assert kinds(await attach(gw, started.id))[-1] == "completed"
        clock.advance(2)
        error = await status_of(gw.stub.AttachResponse(pb.AttachResponseRequest(response_id=started.id)))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "expired" in (error.details() or "") and "final response" in (error.details() or "")
        still = await gw.stub.GetResponse(pb.GetResponseRequest(response_id=started.id))
        assert output_text(still.response) == "kept a minute"
    await provider.aclose()


async def test_a_log_over_its_size_cap_keeps_only_the_final_response_and_attach_says_so(fake: FakeOpenAI) -> None:
    provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model="fake-model"))
    async with running_gateway(provider=provider, store=MemoryStore(), background_log_max_bytes=2000) as gw:
        fake.add(Reply(text="many words " * 100))
        started = response_of((await collect(gw.stub.CreateResponse(background("x"))))[0])
        done = await poll_until_ended(gw, started.id)
        assert done.status == S.RESPONSE_STATUS_COMPLETED
        error = await status_of(gw.stub.AttachResponse(pb.AttachResponseRequest(response_id=started.id)))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "2000 bytes" in (error.details() or "") and "final response" in (error.details() or "")
    await provider.aclose()


async def test_a_converse_session_attaches_to_a_background_run_and_steers_it(
    fake: FakeOpenAI, gw: GatewayClient
) -> None:
    fake.add(Reply(text="I will use the US endpoint for this", hold_at=4), Reply(text="Using the EU endpoint."))
    started = response_of((await collect(gw.stub.CreateResponse(background("deploy it"))))[0])
    session = Session(gw)
    await session.call.write(pb.ConverseRequest(attach=pb.AttachResponseRequest(response_id=started.id)))
    await session.until("output_text_delta")
    await fake.wait_held()
    await session.send(steer("stop, use the EU endpoint instead"))
    await session.until("input_injected")
    fake.release()
    terminal = await session.until("terminal")
    await session.call.done_writing()
    assert_valid_stream(session.events)
    response = terminal.completed.response
    assert output_text(response).endswith("Using the EU endpoint.")
    assert "EU endpoint instead" in str(fake.chat_requests[-1]["messages"])


async def test_a_converse_session_attaching_to_an_unknown_response_ends_not_found(gw: GatewayClient) -> None:
    call = gw.stub.Converse()
    await call.write(pb.ConverseRequest(attach=pb.AttachResponseRequest(response_id="resp_nope")))
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call.read()
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_converse_session_attached_to_a_background_run_decides_its_approval() -> None:
    provider = ScriptedProvider([[Call.of("send_mail", {"to": "x"}, call_id="m")]])
    async with running_gateway(provider=provider) as gw:
        request = background("mail them")
        request.tools.append(needs_approval(function_tool("send_mail", to="string")))
        started = response_of((await collect(gw.stub.CreateResponse(request)))[0])
        session = Session(gw)
        await session.call.write(pb.ConverseRequest(attach=pb.AttachResponseRequest(response_id=started.id)))
        await session.until("approval_requested")
        await session.send(approval("m", True))
        terminal = await session.until("terminal")
        await session.call.done_writing()
    assert_valid_stream(session.events)
    assert [c.call_id for c in terminal.requires_action.tool_calls] == ["m"]
    assert not terminal.requires_action.approval_requests


async def test_a_background_run_holds_its_admission_room_until_it_ends(fake: FakeOpenAI) -> None:
    provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model="fake-model"))
    async with running_gateway(provider=provider, store=MemoryStore(), max_running_responses=1) as gw:
        fake.add(Reply(text="busy " * 40, delay=0.02), Reply(text="next"))
        started = response_of((await collect(gw.stub.CreateResponse(background("long"))))[0])
        refused = await status_of(gw.stub.CreateResponse(user("meanwhile")))
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        await poll_until_ended(gw, started.id)
        assert output_text(await gw.create(user("after"))) == "next"
    await provider.aclose()


async def test_attach_to_another_tenants_background_response_is_not_found(tmp_path: Path) -> None:
    credentials = api_keys(tmp_path)
    provider = ScriptedProvider([[Text("for alice only")]])
    async with running_gateway(provider=provider, **credentials.settings) as gw:
        request = background("secret")
        started = [m async for m in gw.stub.CreateResponse(request, metadata=credentials.of("alice"))]
        response_id = response_of(started[0].event).id
        attach_request = pb.AttachResponseRequest(response_id=response_id)
        events = await collect(gw.stub.AttachResponse(attach_request, metadata=credentials.of("alice")))
        assert kinds(events)[-1] == "completed"
        error = await status_of(gw.stub.AttachResponse(attach_request, metadata=credentials.of("bob")))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        # Nor can bob bind alice's idempotency key to her response: keys are per owner.
        key = (("idempotency-key", "shared-key"),)
        alices = await collect(gw.stub.CreateResponse(request, metadata=credentials.of("alice") + key))
        bobs = await collect(gw.stub.CreateResponse(request, metadata=credentials.of("bob") + key))
        assert response_of(bobs[0]).id != response_of(alices[0]).id


async def test_a_converse_create_cannot_be_background(gw: GatewayClient) -> None:
    call = gw.stub.Converse()
    await call.write(pb.ConverseRequest(create=background("x")))
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call.read()
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "create.background" in (raised.value.details() or "")


async def test_a_principal_at_its_limit_of_running_background_responses_is_refused_until_the_run_ends(
    fake: FakeOpenAI, tmp_path: Path
) -> None:
    credentials = api_keys(tmp_path)
    alice = credentials.of("alice")
    provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model="fake-model"))
    settings = credentials.settings
    async with running_gateway(provider=provider, store=MemoryStore(), max_concurrent_responses=1, **settings) as gw:
        # However the run ends, its slot comes back: the next one may start.
        for ending in ("completed", "failed", "cancelled"):
            fault = {"cut_after": 3} if ending == "failed" else {}
            fake.add(Reply(text="held here then on", hold_at=2, **fault))  # type: ignore[arg-type]
            started = response_of((await collect(gw.stub.CreateResponse(background(ending), metadata=alice)))[0])
            await fake.wait_held()
            # The creating call ended; the run still holds alice's one slot.
            refused = await status_of(gw.stub.CreateResponse(background("more"), metadata=alice))
            assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.details()
            assert "at most 1 responses" in (refused.details() or "")
            # Reading her run is not running another: an attach is let in.
            reading = gw.stub.AttachResponse(pb.AttachResponseRequest(response_id=started.id), metadata=alice)
            assert (await reading.read()).event.WhichOneof("event") == "created"
            if ending == "cancelled":
                await gw.stub.CancelResponse(pb.CancelResponseRequest(response_id=started.id), metadata=alice)
            else:
                fake.release()
            # The slot is given back before the terminal event reaches the log an attach reads.
            assert kind(await read_to_end(reading)) == ending
        fake.add(Reply(text="room again"))
        last = response_of((await collect(gw.stub.CreateResponse(user("after"), metadata=alice)))[-1])
        assert output_text(last) == "room again"
    await provider.aclose()


async def read_to_end(call: Any) -> pb.StreamEvent:
    """The last event of a stream whose first message was read already."""
    last = pb.StreamEvent()
    while (message := await call.read()) != grpc.aio.EOF:
        last = message.event
    return last


class LogFailing(MemoryRunLog):
    """A store whose event log cannot be written (its disk is full, say): everything else works."""

    async def begin(self, response_id: str, owner: str, request: bytes, lease: float) -> None:
        raise OSError("no space left on device")

    async def append(self, response_id: str, events: Any, **kwargs: Any) -> bool:
        raise OSError("no space left on device")

    async def checkpoint(self, response_id: str, checkpoint: Any) -> bool:
        raise OSError("no space left on device")


async def test_a_store_that_cannot_keep_the_event_log_leaves_the_background_run_cancelled_with_unavailable(
    fake: FakeOpenAI,
) -> None:
    store = MemoryStore()
    store.runlog = LogFailing(store.database.runs, store.options)
    provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model="fake-model"))
    key = (("idempotency-key", "report-7"),)
    async with running_gateway(
        provider=provider, store=store, max_concurrent_responses=1, max_running_responses=1
    ) as gw:
        fake.add(Reply(text="never logged", hold_at=1))
        for stream in (False, True):
            call = gw.stub.CreateResponse(background("report", stream=stream), metadata=key, timeout=20)
            failed = await status_of(call)
            assert failed.code() == grpc.StatusCode.UNAVAILABLE, failed.details()
            assert reason_of(failed) == "store_unavailable"
            response_id = resource_of(failed)
            # Stored, and cancelled: nothing runs it, and it does not stay in progress for ever.
            stored = await gw.stub.GetResponse(pb.GetResponseRequest(response_id=response_id))
            assert stored.response.status == S.RESPONSE_STATUS_CANCELLED
            assert not stored.response.output
            # The retry UNAVAILABLE invites (same key) tries again rather than replaying the
            # cancelled response: the key was let go with the run.
        # It gave back its admission room and its principal's slot.
        fake.add(Reply(text="plain runs keep no log"))
        assert output_text(await gw.create(user("plain"))) == "plain runs keep no log"
    await provider.aclose()


def resource_of(err: grpc.aio.AioRpcError) -> str:
    status = rpc_status.from_call(err)
    assert status is not None
    for detail in status.details:
        info = error_details_pb2.ResourceInfo()
        if detail.Unpack(info):
            return str(info.resource_name)
    raise AssertionError(f"no ResourceInfo in {err.details()}")
