"""The Go load generator (bench/loadgen/): built once per run with Debian's Go toolchain, then
run as a child process per block of load. Its own CPU per event is a small fraction of the
gateway's, so the figures that use it (concurrency 32, 1,000 streams) measure the gateway rather
than a Python client sharing its two cores. It also serves as a fake backend (`backend()`) where
a Python one could not keep a thousand streams at 10 tokens/s."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from bench.procs import Child, spawn_command

HERE = Path(__file__).parent / "loadgen"
# One P: with two, Go's idle scheduler threads spin looking for work between events, which on
# two shared cores costs more CPU than the work itself.
_ENV = {**os.environ, "GOMAXPROCS": os.environ.get("BENCH_GOMAXPROCS", "1")}


@functools.cache
def binary() -> str:
    """The built binary's path (build.sh rebuilds only when a source is newer)."""
    out = subprocess.run([str(HERE / "build.sh")], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"building the Go load generator failed:\n{out.stderr}")
    return out.stdout.strip().splitlines()[-1]


async def run(*args: str, started: Callable[[int], None] | None = None) -> dict[str, Any]:
    """One block of load; the generator's report (see main.go). `started` gets its pid."""
    process = await asyncio.create_subprocess_exec(
        binary(), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=_ENV
    )
    if started is not None:
        started(process.pid)
    out, err = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"loadgen {' '.join(args)} failed: {err.decode()[-2000:]}")
    report: dict[str, Any] = json.loads(out)
    return report


@contextlib.asynccontextmanager
async def backend() -> AsyncIterator[Child]:
    child = await spawn_command("go-backend", [binary(), "-mode", "backend"])
    try:
        yield child
    finally:
        await child.stop()
