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
backend.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

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


async def measure(gateway: Child, request: pb.CreateResponseRequest, concurrent: int, timeout: float) -> dict[str, Any]:
    options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    async with grpc.aio.insecure_channel(gateway.target, options=options) as channel:
        await channel.channel_ready()
        # One first, alone: its CPU seconds (after a warm-up that caches nothing of the next one,
        # whose schemas are renamed so no verdict is reused).
        await one(channel, renamed(request, "warm"), timeout)
        cpu0 = gateway.cpu_seconds_with_children()
        t0 = time.perf_counter()
        outcome = await one(channel, renamed(request, "alone"), timeout)
        cpu = gateway.cpu_seconds_with_children() - cpu0
        alone = {"outcome": outcome, "cpu_s": cpu, "wall_s": time.perf_counter() - t0}
        # The same probes with nothing running: what the host's own load adds to every figure.
        async with probing(gateway) as idle:
            await asyncio.sleep(3)
        requests = [renamed(request, f"c{n}") for n in range(concurrent)]
        rss_before = gateway.rss_bytes()
        async with probing(gateway) as latencies:
            await asyncio.sleep(0.2)
            cpu0 = gateway.cpu_seconds_with_children()
            t0 = time.perf_counter()
            outcomes = await asyncio.gather(*(one(channel, r, timeout) for r in requests))
            wall = time.perf_counter() - t0
            cpu = gateway.cpu_seconds_with_children() - cpu0
    return {
        "request_bytes": request.ByteSize(),
        "alone": alone,
        "concurrent": {
            "n": concurrent,
            "outcomes": outcomes if concurrent <= 8 else outcome_counts(outcomes),
            "rss_before_mib": rss_before / 2**20,
            "peak_rss_mib": gateway.peak_rss_bytes() / 2**20,
            "worker_process_peak_rss_mib": sum(rss_bytes(child, "VmHWM") for child in children(gateway.pid)) / 2**20,
            "wall_s": wall,
            "cpu_s": cpu,
            "health_checks": len(latencies),
            "health_max_ms": max(latencies) * 1000,
            "health_p50_ms": statistics.median(latencies) * 1000,
            "health_p95_ms": percentile(latencies, 95) * 1000,
        },
        "idle": {
            "health_checks": len(idle),
            "health_max_ms": max(idle) * 1000,
            "health_p95_ms": percentile(idle, 95) * 1000,
        },
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
async def probing(gateway: Child) -> AsyncIterator[list[float]]:
    """Health checks every 20 ms from a process of their own (this one's event loop is busy
    sending and reading the large requests): their latencies, in seconds, once the block ends."""
    latencies: list[float] = []
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, "-m", "bench.limits", "--probe", gateway.target, "--probe-out", out.name]
        prober = await spawn_command("prober", command)
        try:
            yield latencies
        finally:
            await prober.stop()
        latencies += json.loads(await asyncio.to_thread(Path(out.name).read_text))


async def probe(target: str, out: str) -> None:
    """In the prober process: READY, then health checks until stopped, their latencies to `out`."""
    from bench.procs import until_stopped

    stop = asyncio.Event()
    async with grpc.aio.insecure_channel(target) as channel:
        await channel.channel_ready()
        checks = asyncio.create_task(probe_health(channel, stop))
        print("READY 0", flush=True)
        await until_stopped()
        stop.set()
        await asyncio.to_thread(Path(out).write_text, json.dumps(await checks))


def renamed(request: pb.CreateResponseRequest, tag: str) -> pb.CreateResponseRequest:
    """The same request with every schema made distinct from earlier ones (no cached verdicts)."""
    copy = pb.CreateResponseRequest()
    copy.CopyFrom(request)
    for tool in copy.tools:
        tool.function.parameters.fields["title"].string_value = f"{tag}-{tool.function.name}"
    return copy


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    backend = await spawn("backend", "bench.backend")
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
            request = worst_request(model_name(words=args.words), args.item_chars, args.schema_bytes, args.items)
            return await measure(gateway, request, args.concurrent, args.timeout)
        finally:
            await gateway.stop()
            await backend.stop()


def serve(backend_url: str, data_dir: str) -> None:
    """The gateway as `antwort-grpc serve` builds it from its defaults (memory store) and on its
    event loop (asyncio's when slow steps are to be logged: its debug mode does that), READY <port>."""
    from antwort_grpc import event_loop

    event_loop.run(_serve(backend_url, data_dir), "asyncio" if os.environ.get("BENCH_SLOW_CALLBACKS") else None)


async def _serve(backend_url: str, data_dir: str) -> None:
    from antwort_grpc.config import GatewaySettings
    from antwort_grpc.core import assemble
    from antwort_grpc.gateway import start_gateway
    from antwort_grpc.gateway import tune_gc
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
    tune_gc()
    print(f"READY {gateway.port}", flush=True)
    try:
        await until_stopped()
    finally:
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
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--probe", default="", help=argparse.SUPPRESS)
    parser.add_argument("--probe-out", default="", help=argparse.SUPPRESS)
    parser.add_argument("--backend-url", default="", help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        asyncio.run(probe(args.probe, args.probe_out))
        return
    if args.serve:
        serve(args.backend_url, args.data_dir)
        return
    print(json.dumps(asyncio.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()
