"""The five figures of the benchmark. Each is a ratio of two things measured side by side in the
same run (absolute times on a shared machine are noise), repeated; `Results` keeps every run.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from antwort_grpc import pb
from bench import loadgen, profile
from bench.backend import model_name
from bench.clients import Direct, channel, create, drive, function_tool, read_stream
from bench.procs import Child, cpu_seconds, spawn
from bench.stats import Results, percentile


@dataclass(frozen=True)
class Scale:
    rounds: int  # repeats of figures 2 and 5
    stream_rounds: int  # figure 1: pairs of short blocks, gateway and echo side by side
    deltas: int  # figure 1: text deltas per streamed response
    c1_requests: int  # figure 2: requests per block at concurrency 1
    stream_requests: int  # figure 2: streamed requests per block (time to first token)
    cn_requests: int  # figure 2: requests per block at concurrency `concurrency`
    concurrency: int
    tool_repeats: int  # figure 3
    streams: int  # figure 4: conversations held open at once
    stream_repeats: int
    tokens: (
        int  # figure 4: tokens per model turn, `token_delay` seconds apart (10/s: 10,000 tokens/s over 1,000 streams)
    )
    token_delay: float
    growth_turns: int  # figure 5: turns per block (responses = growth_turns / turns)
    chain: int  # figure 5: previous_response_id chain length


FULL = Scale(
    rounds=7,
    stream_rounds=31,
    deltas=2000,
    c1_requests=300,
    stream_requests=100,
    cn_requests=1000,
    concurrency=32,
    tool_repeats=10,
    streams=1000,
    stream_repeats=3,
    tokens=40,
    token_delay=0.1,
    growth_turns=200,
    chain=50,
)
TINY = Scale(
    rounds=1,
    stream_rounds=1,
    deltas=50,
    c1_requests=5,
    stream_requests=3,
    cn_requests=16,
    concurrency=4,
    tool_repeats=1,
    streams=8,
    stream_repeats=1,
    tokens=3,
    token_delay=0.01,
    growth_turns=10,
    chain=4,
)

TEXT = "token "


@contextlib.asynccontextmanager
async def running(name: str, module: str, *args: str) -> AsyncIterator[Child]:
    child = await spawn(name, module, *args)
    profiler = await profile.attach(child.pid, name) if name == "gateway" else None
    try:
        yield child
    finally:
        await child.stop()
        await profile.detach(profiler)


def gateway(*args: str) -> contextlib.AbstractAsyncContextManager[Child]:
    return running("gateway", "bench.gateway", *args)


# -- 1. stream throughput against the transport limit -------------------------------------------


async def stream_throughput(scale: Scale, results: Results) -> None:
    """Events/s of a streamed response from an instant model, over events/s of a bare grpc.aio
    server streaming as many messages of a text delta's size; also their CPU per event.

    The client is grpc's synchronous API on threads: it costs about a quarter of a grpc.aio
    client per message, which leaves the server, not the client, the bottleneck of the stream."""
    async with (
        gateway("--provider", "instant", "--deltas", str(scale.deltas), "--text", TEXT) as gw,
        running("echo", "bench.echo", "--count", str(scale.deltas + 8), "--text", TEXT) as echo,
    ):
        request = pb.CreateResponseRequest(input_text="go", stream=True, store=False)
        sides = {"gateway": gw, "echo": echo}
        for child in sides.values():
            await _stream_load(child, request, 1)  # warm-up
        # Many short blocks, alternating, so both sides see the same moments of a shared machine.
        for n in range(scale.stream_rounds):
            rate: dict[str, float] = {}
            cpu: dict[str, float] = {}
            for side in list(sides) if n % 2 == 0 else list(reversed(sides)):
                child = sides[side]
                before = child.cpu_seconds()
                events, seconds = await _stream_load(child, request, 1)
                rate[side] = events / seconds
                cpu[side] = (child.cpu_seconds() - before) / events
            results.add("stream_throughput_ratio", rate["gateway"] / rate["echo"])
            results.add("stream_gateway_events_per_s", rate["gateway"], "events/s")
            results.add("stream_echo_events_per_s", rate["echo"], "events/s")
            results.add("stream_cpu_vs_echo", cpu["echo"] / cpu["gateway"] if cpu["gateway"] else math.nan)
            results.add("stream_gateway_cpu_us_per_event", cpu["gateway"] * 1e6, "µs")
            results.add("stream_echo_cpu_us_per_event", cpu["echo"] * 1e6, "µs")


STREAM_CLIENTS = 2


async def _stream_load(child: Child, request: pb.CreateResponseRequest, responses: int) -> tuple[int, float]:
    """`responses` streams on each of STREAM_CLIENTS client threads: (events, wall seconds)."""
    started = time.perf_counter()
    counts = await asyncio.gather(
        *(asyncio.to_thread(_read_streams, child.target, request, responses) for _ in range(STREAM_CLIENTS))
    )
    return sum(counts), time.perf_counter() - started


def _read_streams(target: str, request: pb.CreateResponseRequest, responses: int) -> int:
    with grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) as sync_channel:
        call = sync_channel.unary_stream(
            "/antwort.v1.ResponsesService/CreateResponse",
            request_serializer=pb.CreateResponseRequest.SerializeToString,
            response_deserializer=pb.CreateResponseResponse.FromString,
        )
        return sum(1 for _ in range(responses) for _ in call(request))


# -- 2. gateway overhead against the direct backend ---------------------------------------------


async def overhead(scale: Scale, results: Results, backend: Child) -> None:
    """The same requests through the gateway and straight to the fake backend."""
    model = model_name(words=20)
    plain = pb.CreateResponseRequest(model=model, input_text="hello", stream=False)
    streamed = pb.CreateResponseRequest(model=model, input_text="hello", stream=True)
    async with (
        gateway("--provider", "openai", "--backend-url", backend.url) as gw,
        channel(gw.target) as grpc_channel,
        Direct(backend.url, model) as direct,
        running("echo", "bench.echo", "--count", "1") as echo,
        channel(echo.target) as echo_channel,
    ):
        stub = pb.ResponsesServiceStub(grpc_channel)
        echo_stub = pb.ResponsesServiceStub(echo_channel)

        async def via_gateway() -> None:
            response = await create(stub, plain)
            if response.status != pb.ResponseStatus.RESPONSE_STATUS_COMPLETED:
                raise RuntimeError(f"gateway answered {pb.ResponseStatus.Name(response.status)}")

        async def via_echo() -> None:
            # The floor under any gRPC gateway in Python: one grpc.aio call of one message.
            async for _ in echo_stub.CreateResponse(plain):
                pass

        calls = {"gateway": via_gateway, "direct": direct.complete}
        body = Path(tempfile.mkdtemp(prefix="bench-")) / "body.json"
        body.write_bytes(direct.plain)
        go_load = {
            "gateway": ["-mode", "create", "-target", gw.target, "-model", model],
            "direct": ["-mode", "http", "-url", direct.url, "-body", str(body)],
        }
        # Warm both paths (connection pools, first-call code paths).
        for call in (via_gateway, direct.complete, via_echo):
            await drive(call, 20, 4)
        pooled: dict[str, list[float]] = {"gateway": [], "direct": []}
        for n in range(scale.rounds):
            flip = n % 2 == 1
            # Concurrency 1: latency, requests/s, and the gateway's CPU per request.
            lat: dict[str, list[float]] = {}
            wall: dict[str, float] = {}
            for side in _order(flip):
                before, client_before = gw.cpu_seconds(), time.process_time()
                lat[side], wall[side] = await drive(calls[side], scale.c1_requests, 1)
                client = _ms(time.process_time() - client_before) / scale.c1_requests
                results.add(f"client_cpu_ms_per_request_{side}", client, "ms")
                if side == "gateway":
                    results.add("gateway_cpu_ms_per_request", _ms(gw.cpu_seconds() - before) / scale.c1_requests, "ms")
                pooled[side] += lat[side]
            echo_latency, _ = await drive(via_echo, scale.c1_requests, 1)
            results.add("grpc_floor_latency_p50_ms", _ms(percentile(echo_latency, 50)), "ms")
            p50 = {side: percentile(lat[side], 50) for side in lat}
            p99 = {side: percentile(lat[side], 99) for side in lat}
            results.add("added_latency_p50_ms", _ms(p50["gateway"] - p50["direct"]), "ms")
            results.add("added_latency_p99_ms", _ms(p99["gateway"] - p99["direct"]), "ms")
            results.add("direct_latency_p50_ms", _ms(p50["direct"]), "ms")
            results.add("gateway_latency_p50_ms", _ms(p50["gateway"]), "ms")
            results.add("throughput_ratio_c1", wall["direct"] / wall["gateway"])
            # Time to the first token of a streamed answer: the gateway's first text delta event
            # against the backend's first content chunk.
            first: dict[str, list[float]] = {"gateway": [], "direct": []}
            first_event: list[float] = []
            for side in _order(flip):
                for _ in range(scale.stream_requests):
                    if side == "gateway":
                        read = await read_stream(stub, streamed)
                        first[side].append(read.first_text - read.started)
                        first_event.append(read.first_event - read.started)
                    else:
                        first[side].append((await direct.first_token())[0])
            added_ttfe = statistics.median(first["gateway"]) - statistics.median(first["direct"])
            results.add("added_ttfe_ms", _ms(added_ttfe), "ms")
            # Less the bare call of this round: what the gateway's own work adds to the first
            # token (the gRPC call itself is in any gateway's path).
            results.add("added_ttfe_over_floor_ms", _ms(added_ttfe - percentile(echo_latency, 50)), "ms")
            results.add("gateway_created_event_ms", _ms(statistics.median(first_event)), "ms")
            # Concurrency N: requests/s and CPU per request under load, both sides driven by the
            # Go load generator (a Python client would be the bottleneck on these two cores).
            for side in _order(flip):
                before = gw.cpu_seconds()
                report = await loadgen.run(*go_load[side], "-n", str(scale.cn_requests), "-c", str(scale.concurrency))
                if report["errors"]:
                    raise RuntimeError(f"concurrency {scale.concurrency}: {report['errors']} {side} requests failed")
                wall[side] = report["wall_s"]
                results.add(f"loadgen_cpu_ms_per_request_c32_{side}", _ms(report["cpu_s"]) / scale.cn_requests, "ms")
                if side == "gateway":
                    cpu = _ms(gw.cpu_seconds() - before) / scale.cn_requests
                    results.add("gateway_cpu_ms_per_request_c32", cpu, "ms")
            results.add("throughput_ratio_c32", wall["direct"] / wall["gateway"])
            # The same answer streamed and not: the gateway's CPU per request of each (concurrency 1).
            # (Batched: the client asks for batch_events, events produced together in one message.)
            cpu = {}
            modes = {
                "create": ["-mode", "create"],
                "stream": ["-mode", "stream"],
                "batched": ["-mode", "stream", "-batch"],
            }
            for mode in reversed(modes) if flip else modes:
                before = gw.cpu_seconds()
                report = await loadgen.run(*modes[mode], "-target", gw.target, "-model", model,
                                           "-n", str(scale.c1_requests), "-c", "1")  # fmt: skip
                if report["errors"]:
                    raise RuntimeError(f"{mode}: {report['errors']} requests failed")
                cpu[mode] = (gw.cpu_seconds() - before) / scale.c1_requests
            results.add("stream_cpu_ratio", cpu["stream"] / cpu["create"])
            results.add("stream_cpu_ratio_batched", cpu["batched"] / cpu["create"])
            results.add("gateway_cpu_ms_per_streamed_request", _ms(cpu["stream"]), "ms")
        # The p99 of a few hundred samples is one or two requests: pool every round's samples.
        results.set_headline(
            "added_latency_p99_ms", _ms(percentile(pooled["gateway"], 99) - percentile(pooled["direct"], 99))
        )


def _order(flip: bool) -> list[str]:
    return ["direct", "gateway"] if flip else ["gateway", "direct"]


def _ms(seconds: float) -> float:
    return seconds * 1e3


# -- 3. parallel tools ----------------------------------------------------------------------------


TOOL_SECONDS = 0.2


async def parallel_tools(scale: Scale, results: Results, *, remote: bool = False) -> None:
    """A model that calls 8 tools of 200 ms at once: the whole response's time over 200 ms. The
    tools run in the gateway's process, or (`remote`) in a ToolExecutorService over gRPC."""
    key = "parallel_tools_ratio_remote" if remote else "parallel_tools_ratio"
    args = ["--provider", "tools", "--calls", "8", "--tool-seconds", str(TOOL_SECONDS)]
    async with contextlib.AsyncExitStack() as stack:
        if remote:
            service = await stack.enter_async_context(
                running("executor", "bench.executor", "--tool-seconds", str(TOOL_SECONDS))
            )
            args += ["--remote-executor", service.target]
        gw = await stack.enter_async_context(gateway(*args))
        await _time_tools(scale, results, key, gw)


async def _time_tools(scale: Scale, results: Results, key: str, gw: Child) -> None:
    request = pb.CreateResponseRequest(input_text="go", stream=True, tools=[function_tool("sleep")])
    async with channel(gw.target) as grpc_channel:
        stub = pb.ResponsesServiceStub(grpc_channel)
        await read_stream(stub, request)  # warm-up
        for _ in range(scale.tool_repeats):
            read = await read_stream(stub, request)
            if read.terminal != "completed":
                raise RuntimeError(f"parallel tools: the response ended {read.terminal}")
            results.add(key, (read.ended - read.started) / TOOL_SECONDS)


# -- 4. concurrency and memory --------------------------------------------------------------------


# How many times longer a conversation may be made, doubling, until all of them receive tokens
# at once (a slower host takes longer to open 1,000 calls than a 4 s turn lasts).
MAX_STRETCH = 8


async def concurrency(scale: Scale, results: Results, backend: Child) -> None:
    """Many streamed conversations held open at once, the backend producing tokens at a realistic
    pace: errors, memory per stream, token lag, and the gateway's CPU per token delivered. The
    backend and the client are the Go load generator (bench/loadgen/): a Python backend cannot
    write 10,000 chunks a second beside a gateway on these two cores, and a Python client would spend more CPU
    per event than the gateway it measures.

    The held figures need every conversation receiving tokens at once: when the ramp of opening
    them outlasts the first ones, the conversations are made longer (more tokens at the same
    pace) and run again, up to MAX_STRETCH times as long; past that the figures are reported from
    the whole run, and `concurrency_all_streaming` says 0 (invalid), never left out. Beside it, a
    bare grpc.aio server streams as many messages at the same pace to as many conversations: the
    transport's own cost per message at that scale."""
    tokens = scale.tokens
    async with loadgen.backend() as go_backend:
        for _ in range(scale.stream_repeats):
            while True:
                # A fresh gateway each time: Python keeps memory it once had, so a second run would
                # show no growth.
                # What one process carries with every conversation admitted, not what admission
                # lets in (the overload and workers figures measure that): no cap, no lag bound.
                carry = ("--max-running", "0", "--admission-max-lag", "0")
                async with gateway("--provider", "openai", "--backend-url", go_backend.url, *carry) as gw:
                    figures, all_streaming = await _hold_streams(scale, gw, go_backend, tokens)
                if all_streaming or tokens >= scale.tokens * MAX_STRETCH:
                    break
                tokens *= 2
            for key, (value, unit) in figures.items():
                results.add(key, value, unit)
            results.add("concurrency_tokens_per_turn", tokens)
    # Both turns of a conversation are text deltas at the backend's pace: as many messages here.
    async with running("echo", "bench.echo", "--count", str(2 * tokens), "--delay", str(scale.token_delay)) as echo:
        for _ in range(scale.stream_repeats):
            before = echo.cpu_seconds()
            report = await loadgen.run("-mode", "stream", "-target", echo.target,
                                       "-n", str(scale.streams), "-c", str(scale.streams))  # fmt: skip
            if report["errors"]:
                raise RuntimeError(f"the paced echo: {report['errors']} of {scale.streams} streams failed")
            echo_us = (echo.cpu_seconds() - before) / max(1, report["deltas"]) * 1e6
            results.add("echo_cpu_us_per_message_1000_streams", echo_us, "µs")
    gateway_us = results.figures["gateway_cpu_us_per_token_1000_streams"].value
    echo_us = results.figures["echo_cpu_us_per_message_1000_streams"].value
    results.add("gateway_cpu_per_token_vs_echo_1000_streams", gateway_us / echo_us)


async def _hold_streams(
    scale: Scale, gw: Child, backend: Child, tokens: int
) -> tuple[dict[str, tuple[float, str]], bool]:
    """One run of `scale.streams` conversations of `tokens` tokens a turn: its figures (key:
    value, unit), and whether every conversation was receiving tokens at once."""
    warm = model_name(words=3, tools=1)
    await loadgen.run("-mode", "stream", "-target", gw.target, "-model", warm, "-tools",
                      "-n", str(min(50, scale.streams)), "-c", str(min(50, scale.streams)))  # fmt: skip
    await asyncio.sleep(0.5)
    base_rss = gw.rss_bytes()
    peak_rss = base_rss
    model = model_name(words=tokens, delay=scale.token_delay, tools=1, stamp=True)
    # (time, CPU seconds of the gateway, of the backend and the client (both Go))
    cpu_samples: list[tuple[float, float, float]] = []
    client_pid: list[int] = []

    async def sample() -> None:
        nonlocal peak_rss
        while True:
            peak_rss = max(peak_rss, gw.rss_bytes())
            others = backend.cpu_seconds() + sum(_cpu_or_zero(pid) for pid in client_pid)
            cpu_samples.append((time.perf_counter(), gw.cpu_seconds(), others))
            await asyncio.sleep(0.1)

    sampler = asyncio.create_task(sample())
    gateway_before = gw.cpu_seconds()
    try:
        report = await loadgen.run("-mode", "stream", "-target", gw.target, "-model", model, "-tools", "-stamped",
                                   "-n", str(scale.streams), "-c", str(scale.streams),
                                   started=client_pid.append)  # fmt: skip
    finally:
        sampler.cancel()
    gateway_cpu = gw.cpu_seconds() - gateway_before
    figures: dict[str, tuple[float, str]] = {}
    streams = report["streams"]
    errors = report["errors"] + sum(1 for st in streams if not st["sequence_ok"] or st["tokens"] != 2 * tokens)
    figures["concurrency_errors"] = (errors, "")
    figures["concurrency_peak_open"] = (report["peak_open"], "")
    figures["concurrency_peak_streaming"] = (report["peak_streaming"], "")
    figures["rss_per_stream_kb"] = ((peak_rss - base_rss) / scale.streams / 1024, "KiB")
    lags: list[int] = report["lags_ns"]
    tokens_seen = len(lags)
    if lags:
        figures["token_lag_p99_ms"] = (percentile(lags, 99) / 1e6, "ms")
        figures["token_lag_p50_ms"] = (percentile(lags, 50) / 1e6, "ms")
    first_tokens = [st["first_text"] for st in streams if st["first_text"]]
    ends = [st["ended"] for st in streams]
    # Held: from the moment every conversation is receiving tokens until the first one ends
    # (the ramp of a thousand calls opening at once is left out).
    held = [lag for when, lag in zip(report["lag_times"], lags, strict=True)
            if max(first_tokens, default=0) <= when <= min(ends, default=0)]  # fmt: skip
    all_streaming = bool(held) and len(first_tokens) == scale.streams
    figures["concurrency_all_streaming"] = (1.0 if all_streaming else 0.0, "")
    # Invalid (not all at once): the whole run's lags stand in, flagged by the figure above.
    held = held if all_streaming else lags
    if held:
        figures["token_lag_p99_ms_held"] = (percentile(held, 99) / 1e6, "ms")
    figures["concurrency_held_s"] = (max(0.0, min(ends, default=0) - max(first_tokens, default=0)), "s")
    figures["concurrency_wall_s"] = (report["wall_s"], "s")
    if tokens_seen:
        figures["gateway_cpu_us_per_token_1000_streams"] = (gateway_cpu / tokens_seen * 1e6, "µs")
        figures["loadgen_cpu_us_per_token_1000_streams"] = (report["cpu_s"] / tokens_seen * 1e6, "µs")
        figures["tokens_per_delta_event_1000_streams"] = (tokens_seen / max(1, report["deltas"]), "")
    # How busy the machine was in the busiest second: the processes' CPU, in cores.
    busiest = (0.0, 0.0)
    for i, (t0, g0, o0) in enumerate(cpu_samples):
        for t1, g1, o1 in cpu_samples[i + 1 :]:
            if t1 - t0 >= 1.0:
                busiest = max(busiest, ((g1 - g0 + o1 - o0) / (t1 - t0), (g1 - g0) / (t1 - t0)))
                break
    figures["concurrency_busiest_cores"] = (busiest[0], "cores")
    figures["concurrency_busiest_gateway_cores"] = (busiest[1], "cores")
    return figures, all_streaming


def _cpu_or_zero(pid: int) -> float:
    try:
        return cpu_seconds(pid)
    except OSError:
        return 0.0


# -- 5. growth ------------------------------------------------------------------------------------


async def growth(scale: Scale, results: Results, backend: Child) -> None:
    """Gateway CPU per response at 1, 5 and 10 turns, and on a previous_response_id chain."""
    tools = [function_tool("noop")]
    async with (
        gateway("--provider", "openai", "--backend-url", backend.url) as gw,
        channel(gw.target) as grpc_channel,
    ):
        stub = pb.ResponsesServiceStub(grpc_channel)

        def turns_request(turns: int, previous: str = "") -> pb.CreateResponseRequest:
            return pb.CreateResponseRequest(
                model=model_name(words=5, tools=turns - 1),
                input_text="hello",
                stream=True,
                tools=tools,
                previous_response_id=previous,
            )

        # The chain: each response continues the previous one.
        chain: list[str] = []
        for _ in range(scale.chain):
            read = await read_stream(stub, turns_request(1, chain[-1] if chain else ""))
            if read.terminal != "completed":
                raise RuntimeError(f"chain: a response ended {read.terminal}")
            chain.append(read.response_id)
        half = chain[len(chain) // 2 - 1]

        async def block(request: pb.CreateResponseRequest, count: int) -> tuple[float, float]:
            """(gateway CPU seconds, wall seconds) per response."""
            before = gw.cpu_seconds()
            started = time.perf_counter()
            for _ in range(count):
                read = await read_stream(stub, request)
                if read.terminal != "completed":
                    raise RuntimeError(f"growth: a response ended {read.terminal}")
            return (gw.cpu_seconds() - before) / count, (time.perf_counter() - started) / count

        blocks = {
            "turns1": (turns_request(1), scale.growth_turns),
            "turns5": (turns_request(5), max(1, scale.growth_turns // 5)),
            "turns10": (turns_request(10), max(1, scale.growth_turns // 10)),
            "nochain": (turns_request(1), scale.growth_turns // 2),
            "chain_half": (turns_request(1, half), scale.growth_turns // 2),
            "chain": (turns_request(1, chain[-1]), scale.growth_turns // 2),
        }
        for request, _ in blocks.values():
            await read_stream(stub, request)  # warm-up
        for n in range(scale.rounds):
            cpu: dict[str, float] = {}
            wall: dict[str, float] = {}
            names = list(blocks) if n % 2 == 0 else list(reversed(blocks))
            for name in names:
                request, count = blocks[name]
                cpu[name], wall[name] = await block(request, count)
            results.add("turn_cost_ratio_10_vs_1", cpu["turns10"] / (10 * cpu["turns1"]))
            results.add("turn_cost_ratio_5_vs_1", cpu["turns5"] / (5 * cpu["turns1"]))
            results.add("turn_wall_ratio_10_vs_1", wall["turns10"] / (10 * wall["turns1"]))
            # (Tiny runs use a shorter chain under the same keys.)
            results.add("chain50_cost_ratio", cpu["chain"] / cpu["nochain"])
            results.add("chain50_wall_ratio", wall["chain"] / wall["nochain"])
            added_half = cpu["chain_half"] - cpu["nochain"]
            if added_half > 0.1 * cpu["nochain"]:
                # Linear in the chain: twice the chain adds twice the cost (quadratic: four times).
                results.add("chain_growth_full_vs_half", (cpu["chain"] - cpu["nochain"]) / added_half)
            for turns in (1, 5, 10):
                results.add(f"turn_cost_ms_{turns}", cpu[f"turns{turns}"] / turns * 1e3, "ms")
