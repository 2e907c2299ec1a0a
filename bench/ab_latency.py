"""Interleaved A/B of two checkouts' streamed-response latency at concurrency 1: one bench backend,
one gateway per checkout (`bench.gateway --provider openai`, memory store), blocks of requests
alternating between them so both see the same moments of a shared host.

    git worktree add --detach ../base b54fb1a
    python -m bench.ab_latency --a ../base --b . [--rounds 20 --requests 50 --mode stream_uncoalesced]

Prints, per side, the p50 and p90 of the time from sending the request to the last message read
(the whole streamed answer of 20 words), the gateway's CPU per request, and B's p50 ÷ A's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import grpc

from antwort_grpc import pb
from bench.instructions import REQUESTS, _ready, _start
from bench.procs import cpu_seconds
from bench.stats import percentile


async def _block(stub: pb.ResponsesServiceStub, request: pb.CreateResponseRequest, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        async for _ in stub.CreateResponse(request):
            pass
        times.append(time.perf_counter() - started)
    return times


async def _run(targets: dict[str, str], pids: dict[str, int], args: argparse.Namespace) -> None:
    request = REQUESTS[args.mode]()
    latency: dict[str, list[float]] = {side: [] for side in targets}
    cpu: dict[str, float] = dict.fromkeys(targets, 0.0)
    channels = {side: grpc.aio.insecure_channel(target) for side, target in targets.items()}
    try:
        stubs = {side: pb.ResponsesServiceStub(channel) for side, channel in channels.items()}
        for side in targets:
            await _block(stubs[side], request, 30)  # warm-up
        for n in range(args.rounds):
            for side in sorted(targets, reverse=n % 2 == 1):
                before = cpu_seconds(pids[side])
                latency[side] += await _block(stubs[side], request, args.requests)
                cpu[side] += cpu_seconds(pids[side]) - before
    finally:
        for channel in channels.values():
            await channel.close()
    count = args.rounds * args.requests
    for side in targets:
        times = latency[side]
        print(
            f"{side} ({args.checkouts[side]}): p50 {percentile(times, 50) * 1e3:.2f} ms, "
            f"p90 {percentile(times, 90) * 1e3:.2f} ms, mean {statistics.mean(times) * 1e3:.2f} ms, "
            f"gateway CPU {cpu[side] / count * 1e3:.2f} ms per request"
        )
    print(f"B ÷ A, p50: {percentile(latency['B'], 50) / percentile(latency['A'], 50):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--a", type=Path, required=True, help="checkout A (the base)")
    parser.add_argument("--b", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--mode", default="stream_uncoalesced", choices=list(REQUESTS))
    args = parser.parse_args()
    args.checkouts = {"A": args.a.resolve(), "B": args.b.resolve()}
    here = Path(__file__).resolve().parent.parent
    backend = _start(["bench.backend"], here)
    gateways = {}
    try:
        url = f"http://127.0.0.1:{_ready(backend)}/v1"
        for side, checkout in args.checkouts.items():
            gateways[side] = _start(["bench.gateway", "--provider", "openai", "--backend-url", url], checkout)
        targets = {side: f"127.0.0.1:{_ready(gateway)}" for side, gateway in gateways.items()}
        asyncio.run(_run(targets, {side: g.pid for side, g in gateways.items()}, args))
    finally:
        for process in (*gateways.values(), backend):
            process.terminate()
            process.wait()


if __name__ == "__main__":
    main()
