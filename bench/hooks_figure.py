"""`hooks_overhead_ms_per_turn`: what one remote HookService subscribed to every point adds to a
turn, against the same gateway without hooks, measured side by side (interleaved A/B blocks).

The model calls one server-side tool that returns at once and then answers: two turns per
response, each turn passing every point (pause check, before/after model, before/approve/after
tool), plus before/after response once per response: 12 calls, which the gateway groups into 4
exchanges on the hook service's Session stream. A third gateway runs the same hook
in-process (`--hook bench.hook:EveryPoint`): the dispatcher's own cost, without the round trips.
"""

from __future__ import annotations

import contextlib
import statistics

from antwort_grpc import pb
from bench.clients import channel, function_tool, read_stream
from bench.figures import Scale, gateway, running
from bench.procs import Child
from bench.stats import Results

TURNS_PER_RESPONSE = 2


async def hooks_overhead(scale: Scale, results: Results, backend: Child) -> None:
    request = pb.CreateResponseRequest(input_text="go", stream=True, tools=[function_tool("sleep")])
    tools = ["--provider", "tools", "--calls", "1", "--tool-seconds", "0"]
    responses = max(5, scale.c1_requests // 3)
    async with contextlib.AsyncExitStack() as stack:
        hook = await stack.enter_async_context(running("hook", "bench.hook"))
        sides = {
            "none": await stack.enter_async_context(gateway(*tools)),
            "hooks": await stack.enter_async_context(gateway(*tools, "--hook", hook.target)),
            # The same hook in the gateway's process: what the dispatcher itself costs.
            "local": await stack.enter_async_context(gateway(*tools, "--hook", "bench.hook:EveryPoint")),
        }
        stubs = {}
        for side, gw in sides.items():
            stubs[side] = pb.ResponsesServiceStub(await stack.enter_async_context(channel(gw.target)))
            for _ in range(5):  # warm-up: connections, first-call code paths
                await read_stream(stubs[side], request)
        for n in range(scale.rounds):
            per_turn: dict[str, float] = {}
            order = ["none", "hooks", "local"]
            for side in order[n % 3 :] + order[: n % 3]:
                times = []
                for _ in range(responses):
                    read = await read_stream(stubs[side], request)
                    if read.terminal != "completed":
                        raise RuntimeError(f"hooks overhead ({side}): the response ended {read.terminal}")
                    times.append(read.ended - read.started)
                per_turn[side] = statistics.median(times) / TURNS_PER_RESPONSE
            results.add("hooks_overhead_ms_per_turn", (per_turn["hooks"] - per_turn["none"]) * 1e3, "ms")
            results.add("hooks_turn_time_ratio", per_turn["hooks"] / per_turn["none"])
            results.add("hooks_none_ms_per_turn", per_turn["none"] * 1e3, "ms")
            results.add("hooks_local_overhead_ms_per_turn", (per_turn["local"] - per_turn["none"]) * 1e3, "ms")
