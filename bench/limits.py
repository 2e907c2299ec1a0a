"""The most expensive request the default limits admit, and what it costs the gateway:
`python -m bench.limits`.

The request: `max_tools` function tools with distinct schemas as large as `max_schema_bytes` and
`max_tools_bytes` let them be (many small properties: what makes a schema costly to check and
convert), and `max_input_items` input messages, about 8 MB on the wire. Against the bench
backend (a short streamed answer) it reports:

- the gateway's CPU seconds for one such request (the process's CPU-time clock, all threads, and
  that of the worker process it starts for large requests);
- four at once: how many finished, and the latency of gRPC health checks sent every 20 ms (from a
  process of their own) while they ran (what a load balancer would see): the slowest, the 95th
  percentile and the median, beside the same checks with nothing running (the host's own noise);
- the gateway's resident memory before they were sent and at its peak (`--memory-budget` sets
  ANTWORT_MEMORY_BUDGET_BYTES: with `--concurrent 40`, what the requests refused admission cost).

The gateway is a real `antwort-grpc serve` with its defaults, the memory store and the bench
backend, serving both doors.

`--door http` sends the same request as JSON to the HTTP door (`POST /v1/responses`, streamed),
and the prober checks the HTTP door's `/health` beside gRPC health. `--shape` picks the request:
`limits` (the above), `parts` (2,048 messages of many one-character content parts, as many as
the bytes allow: the most objects an admitted request can make), `tiny-items` (as many
one-word input items as the bytes allow: refused by their count, after it was parsed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from antwort_grpc import pb
from antwort_grpc.responses.request_limits import DEFAULT_LIMITS, Limits
from bench.backend import model_name
from bench.procs import Child, children, rss_bytes, spawn, spawn_command


def schema(tool: int, size: int) -> dict[str, Any]:
    """A distinct object schema of about `size` bytes serialized, of many small properties."""

    def of(n: int) -> dict[str, Any]:
        properties = {f"t{tool}_p{i}": {"type": "string", "description": f"field {i} " + "d" * 40} for i in range(n)}
        return {"type": "object", "properties": properties}

    def serialized(n: int) -> int:
        struct = struct_pb2.Struct()
        struct.update(of(n))
        return struct.ByteSize()

    per_property = (serialized(100) - serialized(0)) / 100
    return of(int((size - serialized(0)) / per_property))


def _schema_bytes(limits: Limits) -> int:
    # The most each may have with all of them within the limit of every tool together, if there
    # is one (room left for the tool's name and the title `renamed` adds).
    together = getattr(limits, "max_tools_bytes", 1 << 40) // limits.max_tools - 256
    return min(limits.max_schema_bytes - 4096, together)


def worst_request(model: str, item_chars: int, schema_bytes: int = 0, items: int = 0) -> pb.CreateResponseRequest:
    limits = DEFAULT_LIMITS
    request = pb.CreateResponseRequest(model=model, stream=True, store=False)
    for t in range(limits.max_tools):
        tool = request.tools.add()
        tool.function.name = f"tool_{t}"
        tool.function.parameters.update(schema(t, schema_bytes or _schema_bytes(limits)))
    text = "w" * item_chars
    for i in range(items or limits.max_input_items):
        item = request.input_items.items.add()
        item.message.role = pb.Role.ROLE_USER
        item.message.content.add().input_text.text = f"{i} {text}"
    return request


def parts_request(model: str, size: int) -> pb.CreateResponseRequest:
    """2,048 messages of one-character input_text parts, `size` bytes serialized in all."""
    request = pb.CreateResponseRequest(model=model, stream=True, store=False)
    part = pb.ContentPart(input_text=pb.InputText(text="w"))
    per_item = max(
        1, (size - 64 * DEFAULT_LIMITS.max_input_items) // (part.ByteSize() + 2) // DEFAULT_LIMITS.max_input_items
    )
    for _ in range(DEFAULT_LIMITS.max_input_items):
        item = request.input_items.items.add()
        item.message.role = pb.Role.ROLE_USER
        item.message.content.extend([part] * per_item)
    return request


def tiny_request(model: str, size: int) -> pb.CreateResponseRequest:
    """As many one-word user messages as `size` bytes hold (past the item limit: refused)."""
    request = pb.CreateResponseRequest(model=model, stream=True, store=False)
    item = pb.Item(
        message=pb.Message(role=pb.Role.ROLE_USER, content=[pb.ContentPart(input_text=pb.InputText(text="w"))])
    )
    request.input_items.items.extend([item] * (size // (item.ByteSize() + 3)))
    return request


def request_json(request: pb.CreateResponseRequest) -> dict[str, Any]:
    """The Open Responses body of the same request."""
    from google.protobuf.json_format import MessageToDict

    tools = [
        {"type": "function", "name": tool.function.name, "parameters": MessageToDict(tool.function.parameters)}
        for tool in request.tools
    ]
    items: list[dict[str, Any]] = []
    for item in request.input_items.items:
        content = item.message.content
        if len(content) == 1:
            items.append({"role": "user", "content": content[0].input_text.text})
        else:
            items.append(
                {"role": "user", "content": [{"type": "input_text", "text": p.input_text.text} for p in content]}
            )
    body: dict[str, Any] = {"model": request.model, "input": items, "stream": True, "store": False}
    if tools:
        body["tools"] = tools
    return body


def body_bytes(body: dict[str, Any], tag: str) -> bytes:
    """`body` serialized, its schemas made distinct from earlier ones (as `renamed`)."""
    for tool in body.get("tools", []):
        tool["parameters"]["title"] = f"{tag}-{tool['name']}"
    return json.dumps(body, separators=(",", ":")).encode()


async def one_http(session: aiohttp.ClientSession, url: str, body: bytes, timeout: float) -> str:
    """The last event's type of a streamed create over the HTTP door (or its status and error)."""
    try:
        async with session.post(
            url + "/v1/responses",
            data=body,
            headers={"Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as response:
            if response.status != 200:
                return f"HTTP {response.status}: {(await response.text())[:200]}"
            # Read whole: an event's line holds the Response and its echoed tools (1 MiB).
            stream = await response.read()
            at = stream.rfind(b"event: ")
            return stream[at + 7 : stream.index(b"\n", at)].decode() if at >= 0 else ""
    except (aiohttp.ClientError, TimeoutError) as err:
        return f"{type(err).__name__}: {err}"


async def one(channel: grpc.aio.Channel, request: pb.CreateResponseRequest, timeout: float) -> str:
    stub = pb.ResponsesServiceStub(channel)
    try:
        last = None
        async for message in stub.CreateResponse(request, timeout=timeout):
            last = message.event.WhichOneof("event")
        return str(last)
    except grpc.aio.AioRpcError as err:
        return f"{err.code().name}: {err.details()[:200]}"


async def probe_health(channel: grpc.aio.Channel, stop: asyncio.Event) -> list[float]:
    stub = health_pb2_grpc.HealthStub(channel)
    latencies: list[float] = []
    while not stop.is_set():
        t0 = time.perf_counter()
        await stub.Check(health_pb2.HealthCheckRequest(), timeout=60)
        latencies.append(time.perf_counter() - t0)
        await asyncio.sleep(0.02)
    return latencies


async def probe_http_health(url: str, stop: asyncio.Event) -> list[float]:
    latencies: list[float] = []
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            t0 = time.perf_counter()
            async with session.get(url + "/health") as response:
                await response.read()
            latencies.append(time.perf_counter() - t0)
            await asyncio.sleep(0.02)
    return latencies


Send = Callable[[str], Awaitable[str]]


async def measure(gateway: Child, send: Send, size: int, concurrent: int, http: str) -> dict[str, Any]:
    """`send(tag)`: one request (its schemas made distinct by `tag`), its outcome."""
    # One first, alone: its CPU seconds (after a warm-up that caches nothing of the next one,
    # whose schemas are renamed so no verdict is reused).
    await send("warm")
    cpu0 = gateway.cpu_seconds_with_children()
    t0 = time.perf_counter()
    outcome = await send("alone")
    cpu = gateway.cpu_seconds_with_children() - cpu0
    alone = {"outcome": outcome, "cpu_s": cpu, "wall_s": time.perf_counter() - t0}
    # The same probes with nothing running: what the host's own load adds to every figure.
    async with probing(gateway, http) as idle:
        await asyncio.sleep(3)
    rss_before = gateway.rss_bytes()
    async with probing(gateway, http) as latencies:
        await asyncio.sleep(0.2)
        cpu0 = gateway.cpu_seconds_with_children()
        t0 = time.perf_counter()
        outcomes = await asyncio.gather(*(send(f"c{n}") for n in range(concurrent)))
        wall = time.perf_counter() - t0
        cpu = gateway.cpu_seconds_with_children() - cpu0
    return {
        "request_bytes": size,
        "load_average": os.getloadavg()[0],
        "alone": alone,
        "concurrent": {
            "n": concurrent,
            "outcomes": outcomes if concurrent <= 8 else outcome_counts(outcomes),
            "rss_before_mib": rss_before / 2**20,
            "peak_rss_mib": gateway.peak_rss_bytes() / 2**20,
            "worker_process_peak_rss_mib": sum(rss_bytes(child, "VmHWM") for child in children(gateway.pid)) / 2**20,
            "wall_s": wall,
            "cpu_s": cpu,
            **health_figures(latencies["grpc"], "health"),
            **health_figures(latencies.get("http", []), "http_health"),
        },
        "idle": {
            **health_figures(idle["grpc"], "health"),
            **health_figures(idle.get("http", []), "http_health"),
        },
    }


def health_figures(latencies: list[float], name: str) -> dict[str, Any]:
    if not latencies:
        return {}
    return {
        f"{name}_checks": len(latencies),
        f"{name}_max_ms": max(latencies) * 1000,
        f"{name}_p50_ms": statistics.median(latencies) * 1000,
        f"{name}_p95_ms": percentile(latencies, 95) * 1000,
    }


def percentile(values: list[float], p: int) -> float:
    """The value `p` per cent of `values` are at or below (the nearest rank)."""
    ranked = sorted(values)
    return ranked[max(0, -(-len(ranked) * p // 100) - 1)]


def outcome_counts(outcomes: list[str]) -> dict[str, int]:
    """How many ended each way (a refusal by its status and the start of its message)."""
    counts: dict[str, int] = {}
    for outcome in outcomes:
        key = outcome[:60]
        counts[key] = counts.get(key, 0) + 1
    return counts


@contextlib.asynccontextmanager
async def probing(gateway: Child, http: str = "") -> AsyncIterator[dict[str, list[float]]]:
    """Health checks every 20 ms from a process of their own (this one's event loop is busy
    sending and reading the large requests): their latencies, in seconds, by door (`grpc`, and
    `http` given the HTTP door's URL), once the block ends."""
    latencies: dict[str, list[float]] = {}
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, "-m", "bench.limits", "--probe", gateway.target, "--probe-out", out.name]
        if http:
            command += ["--probe-http", http]
        prober = await spawn_command("prober", command)
        try:
            yield latencies
        finally:
            await prober.stop()
        latencies.update(json.loads(await asyncio.to_thread(Path(out.name).read_text)))


async def probe(target: str, out: str, http: str = "") -> None:
    """In the prober process: READY, then health checks until stopped, their latencies to `out`."""
    from bench.procs import until_stopped

    stop = asyncio.Event()
    async with grpc.aio.insecure_channel(target) as channel:
        await channel.channel_ready()
        checks = {"grpc": asyncio.create_task(probe_health(channel, stop))}
        if http:
            checks["http"] = asyncio.create_task(probe_http_health(http, stop))
        print("READY 0", flush=True)
        await until_stopped()
        stop.set()
        found = {door: await task for door, task in checks.items()}
        await asyncio.to_thread(Path(out).write_text, json.dumps(found))


def renamed(request: pb.CreateResponseRequest, tag: str) -> pb.CreateResponseRequest:
    """The same request with every schema made distinct from earlier ones (no cached verdicts)."""
    copy = pb.CreateResponseRequest()
    copy.CopyFrom(request)
    for tool in copy.tools:
        tool.function.parameters.fields["title"].string_value = f"{tag}-{tool.function.name}"
    return copy


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def the_request(
    args: argparse.Namespace, size: int = DEFAULT_LIMITS.max_request_bytes - 64 * 1024
) -> pb.CreateResponseRequest:
    model = model_name(words=args.words)
    if args.shape == "parts":
        return parts_request(model, size)
    if args.shape == "tiny-items":
        return tiny_request(model, size)
    return worst_request(model, args.item_chars, args.schema_bytes, args.items)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    backend = await spawn("backend", "bench.backend")
    http = f"http://127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory() as data:
        env_args = [
            sys.executable,
            "-m",
            "bench.limits",
            "--serve",
            "--backend-url",
            backend.url,
            "--data-dir",
            data,
            "--http-listen",
            http.removeprefix("http://"),
        ]
        if args.memory_budget is not None:
            os.environ["ANTWORT_MEMORY_BUDGET_BYTES"] = str(args.memory_budget)
        if args.gateway_pythonpath:
            # The gateway of another checkout (the code before a change), the backend this one's;
            # -P: not this directory first on the path.
            os.environ["PYTHONPATH"] = args.gateway_pythonpath
            env_args.insert(1, "-P")
        gateway = await spawn_command("gateway", env_args, timeout=60)
        try:
            request = the_request(args)
            if args.door == "http":
                body = request_json(request)
                size = len(body_bytes(body, "size"))
                if args.shape != "limits" and size > DEFAULT_LIMITS.max_request_bytes:
                    # As many objects as the bytes of a body allow (JSON is larger than protobuf).
                    smaller = int(request.ByteSize() * DEFAULT_LIMITS.max_request_bytes / size * 0.99)
                    body = request_json(the_request(args, smaller))
                    size = len(body_bytes(body, "size"))
                async with aiohttp.ClientSession() as session:

                    async def send_http(tag: str) -> str:
                        return await one_http(session, http, body_bytes(body, tag), args.timeout)

                    return await measure(gateway, send_http, size, args.concurrent, http)
            options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
            async with grpc.aio.insecure_channel(gateway.target, options=options) as channel:
                await channel.channel_ready()

                async def send_grpc(tag: str) -> str:
                    return await one(channel, renamed(request, tag), args.timeout)

                return await measure(gateway, send_grpc, request.ByteSize(), args.concurrent, http)
        finally:
            await gateway.stop()
            await backend.stop()


def serve(backend_url: str, data_dir: str, http_listen: str = "") -> None:
    """The gateway as `antwort-grpc serve` builds it from its defaults (memory store) and on its
    event loop (asyncio's when slow steps are to be logged: its debug mode does that), READY <port>."""
    from antwort_grpc import event_loop

    event_loop.run(
        _serve(backend_url, data_dir, http_listen), "asyncio" if os.environ.get("BENCH_SLOW_CALLBACKS") else None
    )


async def _serve(backend_url: str, data_dir: str, http_listen: str = "") -> None:
    from antwort_grpc.config import GatewaySettings
    from antwort_grpc.core import assemble
    from antwort_grpc.gateway import start_gateway, tune_gc
    from bench.procs import until_stopped

    settings = GatewaySettings(
        listen="127.0.0.1:0", backend_url=backend_url, store="memory", data_dir=Path(data_dir), log_level="WARNING"
    )
    if os.environ.get("BENCH_ONE_WORKER"):
        import concurrent.futures

        asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor(1))
    if os.environ.get("BENCH_SWITCH"):
        sys.setswitchinterval(float(os.environ["BENCH_SWITCH"]))
    if os.environ.get("BENCH_SLOW_CALLBACKS"):
        # Which steps hold the event loop (asyncio's debug mode logs each over 50 ms).
        logging.basicConfig(level=logging.WARNING)
        loop = asyncio.get_running_loop()
        loop.set_debug(True)
        loop.slow_callback_duration = float(os.environ["BENCH_SLOW_CALLBACKS"])
    parts = await assemble(settings)
    gateway = await start_gateway(settings, provider=parts.provider, store=parts.store, executors=parts.executors)
    door = None
    if http_listen:
        from antwort_grpc.http.door import HttpDoor

        door = HttpDoor(gateway.core.front)
        await door.start(http_listen)
    tune_gc()
    print(f"READY {gateway.port}", flush=True)
    try:
        await until_stopped()
    finally:
        if door is not None:
            await door.stop()
        await gateway.stop(0)
        await parts.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--concurrent", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=30.0, help="each request's deadline, seconds")
    parser.add_argument("--words", type=int, default=20)
    parser.add_argument("--items", type=int, default=0, help="input items (default: the most the limits admit)")
    parser.add_argument("--item-chars", type=int, default=3500, help="text of each input item (8 MB in all)")
    parser.add_argument(
        "--schema-bytes", type=int, default=0, help="each schema's size (default: the most the limits admit)"
    )
    parser.add_argument(
        "--memory-budget", type=int, default=None, help="the gateway's ANTWORT_MEMORY_BUDGET_BYTES (default: its own)"
    )
    parser.add_argument("--gateway-pythonpath", default="", help="run the gateway from this source tree")
    parser.add_argument("--door", choices=("grpc", "http"), default="grpc", help="the door the requests go through")
    parser.add_argument("--shape", choices=("limits", "parts", "tiny-items"), default="limits", help="the request")
    parser.add_argument("--http-listen", default="", help=argparse.SUPPRESS)
    parser.add_argument("--probe-http", default="", help=argparse.SUPPRESS)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--probe", default="", help=argparse.SUPPRESS)
    parser.add_argument("--probe-out", default="", help=argparse.SUPPRESS)
    parser.add_argument("--backend-url", default="", help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        asyncio.run(probe(args.probe, args.probe_out, args.probe_http))
        return
    if args.serve:
        serve(args.backend_url, args.data_dir, args.http_listen)
        return
    print(json.dumps(asyncio.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()
