"""Profiles of the gateway under benchmark load: py-spy attached to each gateway process a figure
starts (`python -m bench.run --profile NAME`), summarised as the functions with the most samples.

py-spy samples from outside the process, so the gateway runs unmodified; `--nonblocking` keeps
it from pausing the gateway for each sample.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from contextvars import ContextVar
from pathlib import Path

# BENCH_PROFILE_NATIVE=1: C frames too (grpc's Cython core); py-spy must pause the process for them.
_MODE = ["--native"] if os.environ.get("BENCH_PROFILE_NATIVE") else ["--nonblocking"]
_ROOT = Path(__file__).resolve().parent.parent
_target: ContextVar[Path | None] = ContextVar("profile_dir", default=None)


@contextlib.asynccontextmanager
async def gateways(directory: Path) -> AsyncIterator[None]:
    directory.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (once, before any load)
    token = _target.set(directory)
    try:
        yield
    finally:
        _target.reset(token)


async def attach(pid: int, name: str) -> tuple[asyncio.subprocess.Process, Path] | None:
    directory = _target.get()
    if directory is None:
        return None
    output = directory / f"{name}-{pid}.folded"
    spy = Path(sys.executable).parent / "py-spy"
    process = await asyncio.create_subprocess_exec(
        str(spy), "record", "--pid", str(pid), "--rate", "250", *_MODE,
        "--format", "raw", "--output", str(output), "--full-filenames",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    return process, output


async def detach(profiler: tuple[asyncio.subprocess.Process, Path] | None) -> None:
    """After the profiled process ended: py-spy writes its file and exits; summarise it."""
    if profiler is None:
        return
    process, output = profiler
    try:
        await asyncio.wait_for(process.wait(), 30)
    except TimeoutError:
        process.terminate()
        await process.wait()
    if output.exists():
        output.with_suffix(".md").write_text(summarise(output.read_text()))


def summarise(folded: str, top: int = 30) -> str:
    """The functions with the most samples: on the CPU themselves (self) and below them (total)."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in folded.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        samples += count
        frames = [_short(f) for f in stack.split(";")]
        own[frames[-1]] += count
        for frame in set(frames):
            total[frame] += count
    parts: collections.Counter[str] = collections.Counter()
    for frame, count in own.items():
        parts[_part(frame)] += count
    lines = [f"{samples} samples\n", "| self % | where the time goes |", "| ---: | --- |"]
    lines += [f"| {100 * n / samples:.1f} | {part} |" for part, n in parts.most_common()]
    lines += ["", "| self % | function |", "| ---: | --- |"]
    lines += [f"| {100 * n / samples:.1f} | `{f}` |" for f, n in own.most_common(top)]
    lines += ["", "| total % | function |", "| ---: | --- |"]
    lines += [f"| {100 * n / samples:.1f} | `{f}` |" for f, n in total.most_common(top)]
    return "\n".join(lines) + "\n"


def _part(frame: str) -> str:
    """Which part of the process a frame on the CPU belongs to."""
    if frame.startswith("Handle._run (asyncio/events.py:80)"):
        # Python samples stop at the callback; below it is C: mostly grpc's Cython and core.
        return "C code run from event-loop callbacks (grpc's Cython/core, mostly)"
    if frame.startswith("Thread.run (threading.py"):
        return "other threads: grpc's completion-queue poller"
    for marker, part in (
        ("antwort_grpc/", "antwort_grpc (ours)"),
        ("aiohttp/", "aiohttp"),
        ("pydantic", "pydantic"),
        ("google/protobuf", "protobuf (Python side)"),
        ("grpc/", "grpc (Python side)"),
        ("asyncio/", "asyncio event loop"),
        ("selectors.py", "asyncio event loop"),
    ):
        if marker in frame:
            return part
    return "other"


def _short(frame: str) -> str:
    # "function (/path/to/site-packages/pkg/mod.py:123)" -> "function (pkg/mod.py:123)"
    name, _, where = frame.partition(" (")
    for marker in ("site-packages/", f"{_ROOT}/", "lib/python3.11/"):
        if marker in where:
            where = where.split(marker, 1)[1]
    return f"{name} ({where}" if where else name
