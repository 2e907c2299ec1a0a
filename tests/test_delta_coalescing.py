"""Adaptive delta coalescing through a real gateway: deltas that wait behind a slow reader leave
merged, a reader that keeps up gets one delta per backend chunk, and a request can opt out or
ask for a hold. The backend is paced chunk by chunk (a permit per chunk), so what waits where is
decided by the test, not by timing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from antwort_grpc import pb
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply
from tests.harness import GatewayClient, assert_valid_stream, kind, running_gateway

# Chunks big enough that a few fill the client's flow-control window (64 KiB without BDP
# probing): after that the gateway's writes wait for the reader.
CHUNK = "y" * 3999 + " "
CHUNKS = 40
# Data events of a streamed reply: the role chunk, one per text chunk, the finish and usage chunks.
EVENTS = 1 + CHUNKS + 2


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as backend:
        backend.pace = asyncio.Semaphore(0)
        yield backend


@pytest.fixture
async def gw(fake: FakeOpenAI) -> AsyncIterator[GatewayClient]:
    provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model="fake-model"))
    try:
        async with running_gateway(provider=provider, model="fake-model") as gateway:
            yield gateway
    finally:
        await provider.aclose()


def request(**options: object) -> pb.CreateResponseRequest:
    return pb.CreateResponseRequest(
        input_text="hi",
        stream=True,
        delta_coalescing=pb.DeltaCoalescing(**options),  # type: ignore[arg-type]
    )


async def slow_read(gw: GatewayClient, fake: FakeOpenAI, create: pb.CreateResponseRequest) -> list[pb.StreamEvent]:
    """A reader that reads nothing until the backend has written every chunk."""
    async with grpc.aio.insecure_channel(gw.target, options=[("grpc.http2.bdp_probe", 0)]) as channel:
        call = pb.ResponsesServiceStub(channel).CreateResponse(create)
        await fake.wait_for_requests(1)
        assert fake.pace is not None
        for n in range(1, EVENTS):
            fake.pace.release()
            await fake.wait_written(n + 1)
        return [message.event async for message in call]


async def rest(call: grpc.aio.UnaryStreamCall) -> list[pb.StreamEvent]:
    events = []
    while (message := await call.read()) is not grpc.aio.EOF:
        events.append(message.event)
    return events


def deltas(events: list[pb.StreamEvent]) -> list[str]:
    return [e.output_text_delta.delta for e in events if kind(e) == "output_text_delta"]


async def test_deltas_waiting_behind_a_slow_reader_leave_merged(gw: GatewayClient, fake: FakeOpenAI) -> None:
    fake.add(Reply(text=[CHUNK] * CHUNKS))

    events = await slow_read(gw, fake, request())

    assert_valid_stream(events)
    assert len(deltas(events)) < CHUNKS, "chunks that waited for the reader were merged"
    assert "".join(deltas(events)) == CHUNK * CHUNKS
    assert events[-1].completed.response.output[0].message.content[0].output_text.text == CHUNK * CHUNKS


async def test_a_reader_that_keeps_up_gets_every_chunk_as_its_own_delta(gw: GatewayClient, fake: FakeOpenAI) -> None:
    fake.add(Reply(text=[CHUNK] * CHUNKS))
    assert fake.pace is not None
    call = gw.stub.CreateResponse(request())
    events: list[pb.StreamEvent] = []
    # Lockstep: the backend writes its next chunk only once the client has read the last one.
    for _ in range(CHUNKS):
        fake.pace.release()
        while True:
            message = await call.read()
            assert message is not grpc.aio.EOF
            events.append(message.event)
            if kind(message.event) == "output_text_delta":
                break
    fake.pace.release()  # the finish chunk
    fake.pace.release()  # the usage chunk
    events += await rest(call)

    assert_valid_stream(events)
    assert deltas(events) == [CHUNK] * CHUNKS


async def test_a_request_that_opts_out_gets_every_chunk_even_behind_a_slow_reader(
    gw: GatewayClient, fake: FakeOpenAI
) -> None:
    fake.add(Reply(text=[CHUNK] * CHUNKS))

    events = await slow_read(gw, fake, request(disabled=True))

    assert_valid_stream(events)
    assert deltas(events) == [CHUNK] * CHUNKS


async def test_a_hold_merges_chunks_that_come_within_it(gw: GatewayClient, fake: FakeOpenAI) -> None:
    fake.add(Reply(text=["one ", "two ", "three"]))
    assert fake.pace is not None
    # A long hold: the other chunks come while the first one is held (finish and usage too).
    call = gw.stub.CreateResponse(request(max_hold=Duration(seconds=1)))
    first = await call.read()
    assert kind(first.event) == "created"
    for _ in range(5):
        fake.pace.release()
    events = [first.event, *await rest(call)]

    assert_valid_stream(events)
    assert deltas(events) == ["one two three"]


async def test_a_hold_longer_than_a_second_is_invalid_argument(gw: GatewayClient) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await gw.stream(request(max_hold=Duration(seconds=2)))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "delta_coalescing.max_hold" in (raised.value.details() or "")


async def test_the_first_delta_never_waits_for_the_rest_of_its_read(gw: GatewayClient, fake: FakeOpenAI) -> None:
    fake.pace = None  # the backend writes everything at once: later chunks may share a read
    fake.add(Reply(text=["first ", *["more "] * 200]))

    events = await gw.stream(request())

    assert_valid_stream(events)
    assert deltas(events)[0] == "first "
    assert "".join(deltas(events)) == "first " + "more " * 200
