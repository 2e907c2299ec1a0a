"""The HTTP/SSE door against the gRPC door, one gateway process serving both, the same run:

`http_stream_cpu_ratio`: the gateway's CPU per streamed event over HTTP/SSE ÷ over gRPC, the same
instant-model responses streamed in alternating blocks (each side's CPU divided by the events its
client received); `http_added_latency_p50_ms`: the p50 of a non-streamed request through the HTTP
door to the OpenAI-compatible provider minus the p50 of the same request straight to the fake
backend (`grpc_added_latency_p50_ms_same_run` beside it, the gRPC door measured the same way).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from antwort_grpc import pb
from bench.backend import model_name
from bench.clients import Direct, channel, create, drive
from bench.figures import STREAM_CLIENTS, TEXT, Scale, _stream_load, gateway
from bench.procs import Child
from bench.stats import Results, percentile


def _free_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@contextlib.asynccontextmanager
async def _session(address: str) -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(f"http://{address}", connector=connector, trust_env=False) as session:
        yield session


async def http_cost(scale: Scale, results: Results, backend: Child) -> None:
    await _stream_cpu(scale, results)
    await _added_latency(scale, results, backend)


async def _stream_cpu(scale: Scale, results: Results) -> None:
    """Both sides read by the same kind of client, the one figure 1 uses: blocking, on
    STREAM_CLIENTS threads (a grpc.aio client per message costs the gateway more than the
    threaded one does, which would flatter the HTTP door)."""
    address = _free_address()
    responses = max(1, scale.c1_requests // 30)
    async with gateway(
        "--provider", "instant", "--deltas", str(scale.deltas), "--text", TEXT, "--http-listen", address
    ) as gw:
        grpc_request = pb.CreateResponseRequest(input_text="go", stream=True, store=False)
        http_body = json.dumps({"model": "", "input": "go", "stream": True, "store": False}).encode()

        async def over_grpc() -> int:
            events, _ = await _stream_load(gw, grpc_request, responses)
            return events

        async def over_http() -> int:
            counts = await asyncio.gather(
                *(asyncio.to_thread(_read_http_streams, address, http_body, responses) for _ in range(STREAM_CLIENTS))
            )
            return sum(counts)

        sides = {"grpc": over_grpc, "http": over_http}
        for call in sides.values():
            await call()  # warm-up
        for n in range(scale.rounds):
            per_event: dict[str, float] = {}
            for side in ("grpc", "http") if n % 2 == 0 else ("http", "grpc"):
                before = gw.cpu_seconds()
                events = await sides[side]()
                per_event[side] = (gw.cpu_seconds() - before) / events
            results.add("http_stream_cpu_ratio", per_event["http"] / per_event["grpc"])
            results.add("http_cpu_us_per_streamed_event", per_event["http"] * 1e6, "us")
            results.add("grpc_cpu_us_per_streamed_event_same_run", per_event["grpc"] * 1e6, "us")


def _read_http_streams(address: str, body: bytes, responses: int) -> int:
    """`responses` streamed responses read one after another on one kept-alive connection: the
    events received."""
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    events = 0
    try:
        for _ in range(responses):
            connection.request("POST", "/v1/responses", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            if response.status != 200:
                raise RuntimeError(f"http door answered {response.status}: {response.read()!r}")
            for line in response:
                if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                    events += 1
    finally:
        connection.close()
    return events


async def _added_latency(scale: Scale, results: Results, backend: Child) -> None:
    address = _free_address()
    model = model_name(words=20)
    async with (
        gateway("--provider", "openai", "--backend-url", backend.url, "--http-listen", address) as gw,
        channel(gw.target) as grpc_channel,
        Direct(backend.url, model) as direct,
        _session(address) as session,
    ):
        stub = pb.ResponsesServiceStub(grpc_channel)
        plain = pb.CreateResponseRequest(model=model, input_text="hello", stream=False)
        body = json.dumps({"model": model, "input": "hello"}).encode()
        headers = {"Content-Type": "application/json"}

        async def via_http() -> None:
            async with session.post("/v1/responses", data=body, headers=headers) as response:
                answer: dict[str, Any] = json.loads(await response.read())
            if answer.get("status") != "completed":
                raise RuntimeError(f"http door answered {answer}")

        async def via_grpc() -> None:
            response = await create(stub, plain)
            if response.status != pb.ResponseStatus.RESPONSE_STATUS_COMPLETED:
                raise RuntimeError(f"gateway answered {pb.ResponseStatus.Name(response.status)}")

        calls = {"http": via_http, "grpc": via_grpc, "direct": direct.complete}
        for call in calls.values():
            await drive(call, 20, 4)  # warm-up
        for n in range(scale.rounds):
            order = list(calls)[n % 3 :] + list(calls)[: n % 3]
            p50: dict[str, float] = {}
            for side in order:
                latencies, _ = await drive(calls[side], scale.c1_requests, 1)
                p50[side] = percentile(latencies, 50)
            results.add("http_added_latency_p50_ms", (p50["http"] - p50["direct"]) * 1e3, "ms")
            results.add("grpc_added_latency_p50_ms_same_run", (p50["grpc"] - p50["direct"]) * 1e3, "ms")
            results.add("http_latency_p50_ms", p50["http"] * 1e3, "ms")
