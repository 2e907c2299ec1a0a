"""The gateway's admission of responses: a memory budget for the requests running and a cap of
responses at once, both refusing with RESOURCE_EXHAUSTED and a retry pushback before any work
starts, both sized for the machine by default; and the idle timeout of Converse streams."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from prometheus_client.parser import text_string_to_metric_families

from antwort_grpc import machine, pb
from antwort_grpc.config import GatewaySettings
from antwort_grpc.core import MEMORY_BUDGET_SHARE, RUNNING_PER_PROCESS, admission
from antwort_grpc.edge import estimated_memory
from antwort_grpc.grpc_status import RETRY_PUSHBACK_KEY
from antwort_grpc.providers.scripted import ScriptedProvider, Text, Turn
from antwort_grpc.server import decode
from tests.harness import GatewayClient, collect, output_text, running_gateway, user
from tests.test_interactive_runs import Session


def padded(text: str, size: int) -> pb.CreateResponseRequest:
    """A request of about `size` bytes."""
    request = user(text)
    request.instructions = "x" * size
    return request


async def refusal(gw: GatewayClient, request: pb.CreateResponseRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await gw.create(request)
    return caught.value


def pushback_ms(error: grpc.aio.AioRpcError) -> int:
    trailers = dict(error.trailing_metadata() or ())
    return int(trailers[RETRY_PUSHBACK_KEY])


def retry_delay(error: grpc.aio.AioRpcError) -> float:
    status = rpc_status.from_call(error)
    assert status is not None, "the error carries google.rpc.Status details"
    for detail in status.details:
        info = error_details_pb2.RetryInfo()
        if detail.Unpack(info):
            return info.retry_delay.ToMilliseconds() / 1000
    raise AssertionError("no RetryInfo in the status details")


async def started(provider: ScriptedProvider, gw: GatewayClient, request: pb.CreateResponseRequest) -> asyncio.Task:
    """A response running (its model turn held) while the test goes on."""
    task = asyncio.create_task(gw.create(request))
    await provider.holding.wait()
    return task


async def test_a_response_past_the_memory_budget_is_refused_with_a_retry_pushback() -> None:
    hold = asyncio.Event()
    provider = ScriptedProvider([Turn([Text("first")], hold=hold), [Text("second")]])
    budget = estimated_memory(300_000) + estimated_memory(300_000)  # room for two of 300 kB
    async with running_gateway(provider=provider, memory_budget_bytes=budget) as gw:
        running = await started(provider, gw, padded("one", 300_000))
        error = await refusal(gw, padded("two", 400_000))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "memory budget" in (error.details() or "")
        assert pushback_ms(error) > 0 and retry_delay(error) > 0
        assert len(provider.requests) == 1, "the refused request never reached the model"
        hold.set()
        assert output_text(await running) == "first"
        # Its memory given back, the same request runs.
        assert output_text(await gw.create(padded("two", 400_000))) == "second"


async def test_a_request_larger_than_the_whole_budget_runs_when_nothing_else_does() -> None:
    provider = ScriptedProvider([[Text("ok")]])
    async with running_gateway(provider=provider, memory_budget_bytes=1000) as gw:
        assert output_text(await gw.create(padded("big", 100_000))) == "ok"


async def test_responses_past_the_running_cap_are_refused_with_a_retry_pushback() -> None:
    hold = asyncio.Event()
    provider = ScriptedProvider([Turn([Text("first")], hold=hold), [Text("second")]])
    async with running_gateway(provider=provider, max_running_responses=1) as gw:
        running = await started(provider, gw, user("one"))
        error = await refusal(gw, user("two"))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "at most 1 responses at once" in (error.details() or "")
        assert pushback_ms(error) > 0
        hold.set()
        await running
        assert output_text(await gw.create(user("two"))) == "second"


async def test_a_converse_stream_refused_at_its_first_response_ends_with_the_pushback() -> None:
    hold = asyncio.Event()
    provider = ScriptedProvider([Turn([Text("held")], hold=hold), [Text("on the stream")]])
    async with running_gateway(provider=provider, max_running_responses=1) as gw:
        running = await started(provider, gw, user("elsewhere"))
        session = Session(gw)
        await session.start(user("refused"))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await session.until("terminal")
        # The first message of a session ends it with its status, as a bad request would.
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert pushback_ms(caught.value) > 0
        session = Session(gw)
        hold.set()
        await running
        await session.start(user("admitted"))
        assert kind_of(await session.until("terminal")) == "completed"
        session.call.cancel()


def kind_of(event: pb.StreamEvent) -> str:
    return event.WhichOneof("event") or ""


def test_the_default_admission_is_sized_for_one_event_loop_and_the_machines_memory() -> None:
    sized = admission(GatewaySettings())
    # One process serves on one event loop, whatever the cores (more cores: more workers).
    assert sized.max_running == RUNNING_PER_PROCESS
    assert sized.max_lag == GatewaySettings().admission_max_lag > 0
    assert sized.memory_budget == machine.memory_bytes() // MEMORY_BUDGET_SHARE > 0
    unlimited = admission(GatewaySettings(max_running_responses=0, memory_budget_bytes=0))
    assert (unlimited.max_running, unlimited.memory_budget) == (0, 0)


async def test_an_idle_converse_stream_is_closed_after_the_idle_timeout() -> None:
    provider = ScriptedProvider([[Text("answered")]], repeat=True)
    async with running_gateway(provider=provider, converse_idle_timeout=0.2) as gw:
        session = Session(gw)
        await session.start(user("hi"))
        assert kind_of(await session.until("terminal")) == "completed"
        # Nothing more is sent: the stream is closed, saying why.
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await session.until("terminal")
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "ANTWORT_CONVERSE_IDLE_TIMEOUT" in (caught.value.details() or "")


async def test_a_converse_stream_running_a_response_is_not_idle() -> None:
    hold = asyncio.Event()
    provider = ScriptedProvider([Turn([Text("slow")], hold=hold)])
    async with running_gateway(provider=provider, converse_idle_timeout=0.05) as gw:
        session = Session(gw)
        await session.start(user("hi"))
        await provider.holding.wait()
        # Held well past the idle timeout (the model turn is what it waits for, not the client).
        await asyncio.sleep(0.3)
        hold.set()
        assert output_text_of(await session.until("terminal")) == "slow"
        session.call.cancel()


def output_text_of(event: pb.StreamEvent) -> str:
    return output_text(event.completed.response)


class Parses:
    """The gateway's parses of large requests (those parsed in the worker thread), counted; the
    first held until `let_first` is set, so a test can act while an admitted request is still
    being parsed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, hold_first: bool = False) -> None:
        self.count = 0
        self.started = asyncio.Event()
        self.let_first = asyncio.Event()
        if not hold_first:
            self.let_first.set()
        real = decode.off_loop

        async def counted(function: Any, /, *args: Any) -> Any:
            self.count += 1
            if self.count == 1:
                self.started.set()
                await self.let_first.wait()
            return await real(function, *args)

        monkeypatch.setattr(decode, "off_loop", counted)


LARGE = 2 * decode.PARSE_IN_THREAD_BYTES  # parsed in the worker thread


async def refused_counts(gw: GatewayClient) -> dict[tuple[str, str, str], float]:
    """antwort_requests_refused_total as the gateway's /metrics shows it: (method, code, reason)."""
    port = gw.gateway.metrics_port
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as r:
        exposition = await r.text()
    counts = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == "antwort_requests_refused_total":
                labels = sample.labels
                counts[(labels["method"], labels["code"], labels["reason"])] = sample.value
    return counts


async def test_a_request_refused_admission_is_refused_before_it_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    parses = Parses(monkeypatch, hold_first=True)
    provider = ScriptedProvider([[Text("first")], [Text("second")]])
    budget = estimated_memory(LARGE) + estimated_memory(LARGE) // 2  # room for one
    async with running_gateway(provider=provider, memory_budget_bytes=budget, metrics_listen="127.0.0.1:0") as gw:
        admitted = asyncio.create_task(gw.create(padded("one", LARGE)))
        await parses.started.wait()
        # The first is admitted and its parse is held: the second is refused without being
        # parsed, by its size on the wire alone.
        error = await refusal(gw, padded("two", LARGE))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "memory budget" in (error.details() or "") and pushback_ms(error) > 0
        assert parses.count == 1, "the refused request was parsed"
        parses.let_first.set()
        assert output_text(await admitted) == "first"
        # Its room given back when it ended, the same request is admitted and parsed.
        assert output_text(await gw.create(padded("two", LARGE))) == "second"
        assert parses.count == 2
        refusals = await refused_counts(gw)
    assert refusals == {("CreateResponse", "RESOURCE_EXHAUSTED", "memory_budget"): 1}


async def test_a_request_that_does_not_parse_gives_its_admission_back() -> None:
    provider = ScriptedProvider([[Text("ok")]])
    async with running_gateway(provider=provider, max_running_responses=1) as gw:
        raw = gw.channel.unary_stream("/antwort.v1.ResponsesService/CreateResponse")
        for _ in range(2):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await collect(raw(b"\x0a\x01\xff"))
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # Neither holds the one place.
        assert output_text(await gw.create(user("hi"))) == "ok"
        assert gw.gateway.core.edge.admission.running == 0


async def test_a_converse_create_refused_admission_is_rejected_in_band_before_it_is_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parses = Parses(monkeypatch)
    hold = asyncio.Event()
    provider = ScriptedProvider([Turn([Text("held")], hold=hold), [Text("small")], [Text("after")]])
    budget = estimated_memory(LARGE) + estimated_memory(LARGE) // 2  # room for one large and small ones
    async with running_gateway(provider=provider, memory_budget_bytes=budget) as gw:
        running = await started(provider, gw, padded("elsewhere", LARGE))
        assert parses.count == 1
        session = Session(gw)
        await session.start(user("small"))
        assert output_text_of(await session.until("terminal")) == "small"
        await session.start(padded("large", LARGE))
        await session.until("rejected")
        assert (session.rejected[-1].code, session.rejected[-1].reason) == (8, "memory_budget")
        assert parses.count == 1, "the refused create was parsed"
        # The stream goes on.
        hold.set()
        await running
        await session.start(user("after"))
        assert output_text_of(await session.until("terminal")) == "after"
        session.call.cancel()
        assert provider.requests and len(provider.requests) == 3


async def test_a_connection_past_its_stream_limit_queues_its_next_call_at_the_client() -> None:
    hold = asyncio.Event()
    provider = ScriptedProvider([Turn([Text("first")], hold=hold), [Text("elsewhere")], [Text("queued")]])
    async with running_gateway(provider=provider, max_streams_per_connection=1) as gw:
        running = await started(provider, gw, user("one"))
        queued = asyncio.create_task(gw.create(user("queued")))
        # Another connection is not limited by this one's streams: its call runs to its end
        # while the queued call has not reached the gateway (no request bytes received for it).
        # (A subchannel pool of its own: else grpc shares the first channel's connection.)
        local = [("grpc.use_local_subchannel_pool", 1)]
        async with grpc.aio.insecure_channel(gw.gateway.target, options=local) as channel:
            other = GatewayClient(gw.gateway, channel, pb.ResponsesServiceStub(channel))
            assert output_text(await other.create(user("elsewhere"))) == "elsewhere"
        assert len(provider.requests) == 2 and gw.gateway.core.edge.admission.running == 1
        hold.set()
        assert output_text(await running) == "first"
        assert output_text(await queued) == "queued"


async def test_a_converse_stream_at_the_running_cap_starts_its_next_response_after_a_terminal_event() -> None:
    provider = ScriptedProvider([[Text("answered")]], repeat=True)
    async with running_gateway(provider=provider, max_running_responses=1) as gw:
        session = Session(gw)
        for turn in range(5):
            # Sent the moment the terminal event is read, while the response before still winds
            # down: the room it ran in was given back before that event was written.
            await session.start(user(f"turn {turn}"))
            assert kind_of(await session.until("terminal")) == "completed"
            assert gw.gateway.core.edge.admission.running == 0
        assert session.rejected == []
        session.call.cancel()


async def test_a_loop_that_runs_behind_refuses_new_responses_with_pushback_until_it_catches_up() -> None:
    gate = asyncio.Event()
    provider = ScriptedProvider([Turn([Text("held")], hold=gate), [Text("later")], [Text("again")]])
    async with running_gateway(provider=provider, admission_max_lag=0.02) as gw:
        request = user("hold")
        request.stream = True
        held = gw.stub.CreateResponse(request)
        await held.read()
        await provider.holding.wait()
        # The loop is held for a moment: the lag average goes past the bound.
        lag = gw.gateway.core.edge.admission.lag
        while lag.lag <= 0.02:
            asyncio.get_running_loop().call_soon(time.sleep, 0.3)
            await asyncio.sleep(0.1)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await gw.create(user("now"))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "behind" in (refused.value.details() or "")
        assert dict(refused.value.trailing_metadata() or ()).get("grpc-retry-pushback-ms")
        # Once the loop keeps up again, responses are taken.
        async with asyncio.timeout(30):
            while lag.lag > 0.02:  # noqa: ASYNC110 - a sampled average, not an event
                await asyncio.sleep(0.1)
        assert (await gw.create(user("later"))).status == pb.ResponseStatus.RESPONSE_STATUS_COMPLETED
        gate.set()
        await held.read()
