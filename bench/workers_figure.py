"""Workers: the streams `antwort-grpc serve` carries with 1 worker process and with 2, on one
PostgreSQL (the store workers share), and their ratio `workers_capacity_ratio`.

Carried: every stream of the step completed with all its tokens, in order, and the token lag p99
(the Go backend's write time to the client's event) at most LAG_P99_MS while all of them receive
tokens at once (the held-streams figure's window: the burst of opening them all is left out). The streams are the
held-streams figure's (the Go load generator; the Go backend writing stamped tokens at 10 a
second), one turn of 60 tokens each (`serve` has no server-side tool to call): a step lasts
seconds. The search per worker count: double from a start until a step is not carried, then
bisect between the last carried count and it; the 2-worker search starts at what 1 worker
carried. One gateway per worker count serves all its steps, after a warm-up step (connections,
the store's pool); each step's streams have ended before the next starts.

Admission is off for the measure (no running cap, no loop-lag bound): past capacity the gateway
would refuse, and what is measured here is what the processes serve, not what they admit. The
load generator spreads its streams over CHANNELS connections so the kernel's SO_REUSEPORT hash
gives each worker about half.

On a host where the client, the backend and PostgreSQL share the cores with the gateway (2 cores
here), the ratio says how much a second process gains there, not what a bigger machine gains.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import loadgen
from bench.backend import model_name
from bench.figures import Scale
from bench.procs import Child, children, cpu_seconds
from bench.stats import Results, percentile

ROOT = Path(__file__).resolve().parent.parent
LAG_P99_MS = 100.0
CHANNELS = 32
# Tokens of the one turn a stream has, 10 a second: a step of a few seconds, long enough that
# every stream receives tokens at once after opening a few thousand.
TOKENS = 60


@dataclass(frozen=True)
class Search:
    start: int  # the first count tried with 1 worker
    most: int  # never more streams than this in a step
    bisections: int


FULL_SEARCH = Search(start=64, most=4096, bisections=3)
# Proves the key is produced: counts too small to mean anything.
TINY_SEARCH = Search(start=2, most=4, bisections=0)


@dataclass
class Step:
    count: int
    completed: int
    lag_p99_ms: float
    gateway_cores: float = 0.0  # the gateway's processes' CPU over the step's wall time
    others_cores: float = 0.0  # the Go backend's and the Go client's
    split: float = 1.0  # the least busy worker's CPU ÷ the busiest's (how evenly the kernel spread)

    @property
    def carried(self) -> bool:
        return self.completed == self.count and self.lag_p99_ms <= LAG_P99_MS


async def workers_capacity(scale: Scale, results: Results, backend: Child) -> None:
    tiny = scale.streams <= 16
    search = TINY_SEARCH if tiny else FULL_SEARCH
    # (Tiny: 20 tokens 10 ms apart, long enough for a few streams to be received at once.)
    tokens = 20 if tiny else TOKENS
    # The throwaway cluster the tests use ($ANTWORT_TEST_POSTGRES_URL when set); it installs
    # Debian's package when missing.
    from tests.pg import postgres_server

    carried: dict[int, int] = {}
    with postgres_server() as url:
        async with loadgen.backend() as go_backend:
            for workers in (1, 2):
                start = carried.get(1, search.start) or search.start
                async with serve(workers, url, go_backend.url) as gw:
                    steps = await _search(gw, go_backend, start, search, tokens, scale.token_delay)
                carried[workers] = _report(workers, steps, results)
    results.add("workers_capacity_ratio", carried[2] / carried[1] if carried[1] else 0.0)


async def _search(gw: Child, backend: Child, start: int, search: Search, tokens: int, delay: float) -> list[Step]:
    """Double from `start` while carried (halve while not, down to 1), then bisect."""
    await _step(gw, backend, min(start, 32), tokens, delay)  # warm-up, not counted
    steps: list[Step] = []
    first = await _step(gw, backend, start, tokens, delay)
    steps.append(first)
    good, bad = (start, 0) if first.carried else (0, start)
    while bad == 0 and good < search.most:
        step = await _step(gw, backend, min(good * 2, search.most), tokens, delay)
        steps.append(step)
        good, bad = (step.count, 0) if step.carried else (good, step.count)
    while good == 0 and bad > 1:
        step = await _step(gw, backend, bad // 2, tokens, delay)
        steps.append(step)
        good, bad = (step.count, bad) if step.carried else (0, step.count)
    for _ in range(search.bisections):
        middle = (good + bad) // 2
        if bad == 0 or middle in (good, bad):
            break
        step = await _step(gw, backend, middle, tokens, delay)
        steps.append(step)
        good, bad = (middle, bad) if step.carried else (good, middle)
    return steps


async def _step(gw: Child, backend: Child, count: int, tokens: int, delay: float) -> Step:
    # One turn, no tool: `serve` has no server-side tool for the model to call.
    model = model_name(words=tokens, delay=delay, stamp=True)
    workers = children(gw.pid)
    before = [cpu_seconds(pid) for pid in (gw.pid, backend.pid, *workers)]
    report = await loadgen.run("-mode", "stream", "-target", gw.target, "-model", model, "-stamped",
                               "-channels", str(CHANNELS), "-n", str(count), "-c", str(count))  # fmt: skip
    completed = sum(1 for stream in report["streams"] if _completed(stream, tokens))
    spent = [cpu_seconds(pid) - start for pid, start in zip((gw.pid, backend.pid, *workers), before, strict=True)]
    wall = max(report["wall_s"], 1e-9)
    held = _held_lags(report)
    step = Step(count, completed, percentile(held, 99) / 1e6 if held else float("inf"))
    step.gateway_cores = (spent[0] + sum(spent[2:])) / wall
    step.others_cores = (spent[1] + report["cpu_s"]) / wall
    if len(spent) > 3:
        step.split = min(spent[2:]) / max(max(spent[2:]), 1e-9)
    return step


def _report(workers: int, steps: list[Step], results: Results) -> int:
    """The streams carried; the figures of the largest step carried (or of the first step)."""
    for s in steps:
        print(f"bench: workers {workers}: {s.count} streams, {s.completed} completed, lag p99 {s.lag_p99_ms:.0f} ms, "
              f"gateway {s.gateway_cores:.2f} cores, backend + client {s.others_cores:.2f}, split {s.split:.2f}",
              file=sys.stderr, flush=True)  # fmt: skip
    good = [s for s in steps if s.carried]
    largest = max(good, key=lambda s: s.count) if good else steps[0]
    results.add(f"workers_carried_streams_{workers}", largest.count if good else 0)
    results.add(f"workers_steps_{workers}", len(steps))
    results.add(f"workers_gateway_cores_{workers}", largest.gateway_cores, "cores")
    results.add(f"workers_others_cores_{workers}", largest.others_cores, "cores")
    if workers > 1:
        results.add(f"workers_split_{workers}", largest.split)
    return largest.count if good else 0


def _held_lags(report: dict[str, Any]) -> list[int]:
    """The token lags from the moment every stream receives tokens until the first one ends (the
    held-streams figure's window): opening thousands of calls at once is a burst of its own, not
    what the processes carry. None (the step is not carried) when no such moment came."""
    streams = report["streams"]
    first = [stream["first_text"] for stream in streams if stream["first_text"]]
    if len(first) < len(streams):
        return []
    since, until = max(first, default=0.0), min((stream["ended"] for stream in streams), default=0.0)
    return [lag for when, lag in zip(report["lag_times"], report["lags_ns"], strict=True) if since <= when <= until]


def _completed(stream: dict[str, Any], tokens: int) -> bool:
    return stream["terminal"] == "completed" and bool(stream["sequence_ok"]) and stream["tokens"] == tokens


def _environment(store: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTWORT_")}
    return {
        **env,
        "PYTHONPATH": str(ROOT),
        "ANTWORT_STORE": store,
        "ANTWORT_MODEL": "bench",
        "ANTWORT_LOG_LEVEL": "WARNING",
        "ANTWORT_SHUTDOWN_DRAIN": "0",
        # What the processes carry, not what admission lets in (see the module's docstring).
        "ANTWORT_MAX_RUNNING_RESPONSES": "0",
        "ANTWORT_ADMISSION_MAX_LAG": "0",
    }


@contextlib.asynccontextmanager
async def serve(workers: int, store: str, backend_url: str) -> AsyncIterator[Child]:
    """`antwort-grpc serve --workers N` on a free loopback port, once it serves."""
    command = [sys.executable, "-m", "antwort_grpc.cli", "serve", "--workers", str(workers),
               "--listen", "127.0.0.1:0", "--http-listen", "off", "--backend-url", backend_url]  # fmt: skip
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        stdin=asyncio.subprocess.DEVNULL, env=_environment(store), cwd=ROOT,
    )  # fmt: skip
    assert process.stdout is not None
    output: list[str] = []
    try:
        async with asyncio.timeout(120):
            while True:
                line = (await process.stdout.readline()).decode(errors="replace")
                if not line:
                    raise RuntimeError(f"serve --workers {workers} exited before it served:\n{''.join(output)}")
                output.append(line)
                if "serving on" in line and "worker" not in line:
                    break
        port = int(line.rsplit(":", 1)[1].split()[0].strip('"}'))
        drain = asyncio.create_task(_drain(process.stdout))
        child = Child(f"serve-{workers}", process, port)
        try:
            yield child
        finally:
            await child.stop()
            drain.cancel()
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGKILL)
            await process.wait()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass
