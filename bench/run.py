"""`make bench`: run every figure, write bench/results/latest.json, update bench/RESULTS.md.

    python -m bench.run                 # the full run (a few minutes)
    python -m bench.run --tiny          # seconds: checks that everything runs (BENCH_TINY=1 too)
    python -m bench.run --only stream,tools --out /tmp/b   # some figures, elsewhere
    python -m bench.run --profile overhead   # py-spy on the gateway during one figure

Only a full run (no --tiny, --only or --repeats) writes bench/results/latest.json and updates
bench/RESULTS.md; the others write to a temp dir (or --out) unless --report names a file.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench import (
    durable_figure,
    figures,
    hooks_figure,
    http_figure,
    interactive,
    observability_figure,
    overload_figure,
    profile,
    report,
    workers_figure,
)
from bench.procs import Child, load_average, machine, spawn
from bench.stats import Results

HERE = Path(__file__).parent

Figure = Callable[[figures.Scale, Results, Child], Awaitable[None]]


async def _stream(scale: figures.Scale, results: Results, backend: Child) -> None:
    await figures.stream_throughput(scale, results)


async def _tools(scale: figures.Scale, results: Results, backend: Child) -> None:
    await figures.parallel_tools(scale, results)
    await figures.parallel_tools(scale, results, remote=True)


FIGURES: dict[str, Figure] = {
    "stream": _stream,
    "overhead": figures.overhead,
    "tools": _tools,
    "concurrency": figures.concurrency,
    "growth": figures.growth,
    "bidi": interactive.bidi_throughput,
    "steer": interactive.steer_latency,
    "hooks": hooks_figure.hooks_overhead,
    "observability": observability_figure.observability_cost,
    "durable": durable_figure.durable_runs,
    "http": http_figure.http_cost,
    "overload": overload_figure.overload_series,
    "workers": workers_figure.workers_capacity,
}


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


async def run(names: list[str], scale: figures.Scale, profile_figure: str, out: Path) -> dict[str, Any]:
    results = Results()
    started = time.perf_counter()
    load = load_average()
    backend = await spawn("backend", "bench.backend")
    try:
        for name in names:
            print(f"bench: {name} …", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            if name == profile_figure:
                async with profile.gateways(out / f"profile-{name}"):
                    await FIGURES[name](scale, results, backend)
            else:
                await FIGURES[name](scale, results, backend)
            print(f"bench: {name} done in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    finally:
        await backend.stop()
    values = results.values()
    return {
        **{k: (None if math.isnan(v) else v) for k, v in values.items()},
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(),
        "commit": commit(),
        "load_average_at_start": round(load, 2),
        "duration_s": round(time.perf_counter() - started, 1),
        "scale": "tiny" if scale.streams == figures.TINY.streams else "full",
        "repeats": {"rounds": scale.rounds, "stream_rounds": scale.stream_rounds, "streams": scale.stream_repeats},
        "figures_run": names,
        "details": results.details(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--tiny", action="store_true", default=os.environ.get("BENCH_TINY", "") not in ("", "0"))
    parser.add_argument("--only", default="", help=f"comma-separated figures of {','.join(FIGURES)}")
    parser.add_argument("--out", type=Path, default=None, help="default: bench/results for a full run, else a temp dir")
    parser.add_argument("--report", type=Path, default=None, help="RESULTS.md to update (default: bench/RESULTS.md)")
    parser.add_argument("--repeats", type=int, default=0, help="override the number of repeats of every figure")
    parser.add_argument("--profile", default="", help="record py-spy profiles of the gateway during this figure")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(FIGURES)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        parser.error(f"unknown figures {unknown}")
    scale = figures.TINY if args.tiny else figures.FULL
    if args.out is None:
        # Only a full run of every figure replaces bench/results/latest.json.
        full = not args.tiny and not args.only and not args.repeats
        args.out = HERE / "results" if full else Path(tempfile.gettempdir()) / "antwort-bench"
    if args.repeats:
        n = args.repeats
        scale = dataclasses.replace(scale, rounds=n, stream_rounds=n, tool_repeats=n, stream_repeats=n)
    args.out.mkdir(parents=True, exist_ok=True)
    data = asyncio.run(run(names, scale, args.profile, args.out))
    (args.out / "latest.json").write_text(json.dumps(data, indent=2) + "\n")
    print(f"bench: wrote {args.out / 'latest.json'}", file=sys.stderr)
    target = args.report or (None if args.tiny or args.only or args.repeats else HERE / "RESULTS.md")
    if target is not None:
        report.update(target, data)
        print(f"bench: updated {target}", file=sys.stderr)
    print(report.summary(data))


if __name__ == "__main__":
    main()
