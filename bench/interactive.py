"""Figures of interactive runs: the bidirectional Converse stream against the transport limit, and
how long a steering message takes to reach the model, beside the backend's own round trip."""

from __future__ import annotations

import asyncio
import statistics
import time

import grpc

from antwort_grpc import pb
from bench.backend import model_name
from bench.clients import Direct, channel, user_item
from bench.figures import STREAM_CLIENTS, TEXT, Scale, gateway, running
from bench.procs import Child
from bench.stats import Results, percentile


async def bidi_throughput(scale: Scale, results: Results, backend: Child) -> None:
    """Events/s of a response streamed over Converse, over events/s of a bare grpc.aio server
    streaming as many messages of a text delta's size (interleaved blocks, as figure 1)."""
    async with (
        gateway("--provider", "instant", "--deltas", str(scale.deltas), "--text", TEXT) as gw,
        running("echo", "bench.echo", "--count", str(scale.deltas + 8), "--text", TEXT) as echo,
    ):
        request = pb.CreateResponseRequest(input_text="go", stream=True, store=False)
        sides = {"gateway": gw, "echo": echo}
        for side, child in sides.items():
            await _load(child, request, bidi=side == "gateway")  # warm-up
        for n in range(scale.stream_rounds):
            rate: dict[str, float] = {}
            for side in list(sides) if n % 2 == 0 else list(reversed(sides)):
                events, seconds = await _load(sides[side], request, bidi=side == "gateway")
                rate[side] = events / seconds
            results.add("bidi_stream_throughput_ratio", rate["gateway"] / rate["echo"])
            results.add("bidi_gateway_events_per_s", rate["gateway"], "events/s")


async def _load(child: Child, request: pb.CreateResponseRequest, *, bidi: bool) -> tuple[int, float]:
    started = time.perf_counter()
    counts = await asyncio.gather(
        *(asyncio.to_thread(_read, child.target, request, bidi) for _ in range(STREAM_CLIENTS))
    )
    return sum(counts), time.perf_counter() - started


def _read(target: str, request: pb.CreateResponseRequest, bidi: bool) -> int:
    with grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) as sync_channel:
        if not bidi:
            call = sync_channel.unary_stream(
                "/antwort.v1.ResponsesService/CreateResponse",
                request_serializer=pb.CreateResponseRequest.SerializeToString,
                response_deserializer=pb.CreateResponseResponse.FromString,
            )
            return sum(1 for _ in call(request))
        session = sync_channel.stream_stream(
            "/antwort.v1.ResponsesService/Converse",
            request_serializer=pb.ConverseRequest.SerializeToString,
            response_deserializer=pb.ConverseResponse.FromString,
        )
        return sum(1 for _ in session(iter([pb.ConverseRequest(create=request)])))


async def steer_latency(scale: Scale, results: Results, backend: Child) -> None:
    """From the client sending `steer` while the model streams to the first text of the turn
    that holds it (the gateway cuts the stream, and the backend answers the new request); beside
    it, the same backend's time to the first text of a direct request. The difference is what
    the gateway adds."""
    slow = model_name(words=400, delay=0.005)
    short = model_name(words=5, delay=0.005)  # the same time to first text, without reading 400 words
    async with (
        gateway("--provider", "openai", "--backend-url", backend.url) as gw,
        Direct(backend.url, short) as direct,
    ):
        stub = pb.ResponsesServiceStub(channel(gw.target))
        steer = pb.Control(steer=pb.SteerControl(items=[user_item("change of plan")]))
        latencies: list[float] = []
        backend_first: list[float] = []
        for n in range(max(2, scale.rounds * 5)):
            if n % 2 == 0:
                backend_first.append((await direct.first_token())[0])
            latencies.append(await _one_steer(stub, slow, steer))
            if n % 2 == 1:
                backend_first.append((await direct.first_token())[0])
        ms = [s * 1000 for s in latencies]
        base = statistics.median(backend_first) * 1000
        results.add("steer_latency_ms_p50", percentile(ms, 50), "ms")
        results.add("steer_latency_ms_p99", percentile(ms, 99), "ms")
        results.add("steer_backend_first_text_ms", base, "ms")
        results.add("steer_added_ms_p50", percentile(ms, 50) - base, "ms")


async def _one_steer(stub: pb.ResponsesServiceStub, model: str, steer: pb.Control) -> float:
    call = stub.Converse()
    await call.write(pb.ConverseRequest(create=pb.CreateResponseRequest(model=model, input_text="go", store=False)))
    deltas = 0
    sent = 0.0
    try:
        while True:
            message = await call.read()
            assert message is not grpc.aio.EOF, "the session ended before the steered turn answered"
            which = message.event.WhichOneof("event")
            if which == "output_text_delta":
                deltas += 1
                if deltas == 5:
                    sent = time.perf_counter()
                    await call.write(pb.ConverseRequest(control=steer))
                elif sent and message.event.output_text_delta.output_index > 0:
                    return time.perf_counter() - sent
    finally:
        call.cancel()
