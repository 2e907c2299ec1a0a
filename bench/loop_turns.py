"""Event-loop turns, callbacks and tasks per request of two checkouts' gateways: whether a change
added a hop (a task, an await on a new future, a timer, a call handed to a thread) is a count that
the host's load does not move, where a wall-clock A/B on the shared host needs many runs to tell
0.1 ms apart.

    git worktree add --detach ../base 0c9dcaa
    python -m bench.loop_turns --a ../base [--b .] [--requests 200] [--modes unary,http_unary] [--names]

Each gateway (`bench.gateway --provider openai`, memory store, the HTTP door too) runs on the
standard library's loop with bench/loop_counts/sitecustomize.py loaded, which counts; the bench
backend answers 20 words. Per mode, per side: turns of the loop, callbacks run, timers run, tasks
made and calls handed to threads, each per request; with --names, the callbacks whose count per
request differs between the sides. The loop's own idle timers (loop lag, sweepers) are counted
per second of idling and appear in a request's counts only as a small fraction.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import grpc

from antwort_grpc import pb
from bench.instructions import HTTP_REQUESTS, MODES, REQUESTS, _free_port, _ready, _start

HERE = Path(__file__).resolve().parent
WARM_UP = 20
Counts = dict[str, dict[str, float]]


class Side:
    """One checkout's gateway, counting."""

    def __init__(self, checkout: Path, backend_url: str, out: Path) -> None:
        self.http = f"127.0.0.1:{_free_port()}"
        env = dict(
            os.environ,
            PYTHONPATH=f"{HERE / 'loop_counts'}:{checkout}",
            PYTHONHASHSEED="0",
            ANTWORT_EVENT_LOOP="asyncio",
            ANTWORT_LOOP_COUNTS=str(out),
        )
        args = ["bench.gateway", "--provider", "openai", "--backend-url", backend_url, "--http-listen", self.http]
        self.process = subprocess.Popen(
            [sys.executable, "-m", *args],
            cwd=checkout,
            env=env,
            stdin=subprocess.PIPE,  # the bench's processes stop when their stdin closes
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.target = f"127.0.0.1:{_ready(self.process)}"
        self.dump = out / f"{self.process.pid}.json"

    async def counts(self) -> dict[str, Any]:
        """The counts since the last call (the first call only starts counting)."""
        self.dump.unlink(missing_ok=True)
        self.process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not self.dump.exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"{self.process.args!r} wrote no counts (no sitecustomize loaded?)")
            await asyncio.sleep(0.01)
        counts: dict[str, Any] = json.loads(self.dump.read_text())
        return counts


async def _requests(side: Side, session: aiohttp.ClientSession, mode: str, count: int) -> None:
    async with grpc.aio.insecure_channel(side.target) as channel:
        stub = pb.ResponsesServiceStub(channel)
        for _ in range(count):
            if mode in HTTP_REQUESTS:
                async with session.post(f"http://{side.http}/v1/responses", json=HTTP_REQUESTS[mode]) as reply:
                    assert reply.status == 200, await reply.text()
                    await reply.read()
                continue
            async for _ in stub.CreateResponse(REQUESTS[mode]()):
                pass


async def _count(sides: dict[str, Side], modes: list[str], requests: int) -> dict[str, Counts]:
    """Per mode (and "idle", per second), per side: {"counts": …, "names": …} per request."""
    found: dict[str, Counts] = {}
    async with aiohttp.ClientSession(trust_env=False) as session:
        for side in sides.values():
            for mode in modes:
                await _requests(side, session, mode, WARM_UP)
        for mode in [*modes, "idle"]:
            for name, side in sides.items():
                await side.counts()
                if mode == "idle":
                    await asyncio.sleep(1.0)
                else:
                    await _requests(side, session, mode, requests)
                got = await side.counts()
                per = 1 if mode == "idle" else requests
                for kind in ("counts", "names"):
                    found.setdefault(mode, {})[f"{name} {kind}"] = {k: v / per for k, v in got[kind].items()}
    return found


def _report(found: dict[str, Counts], sides: list[str], names: bool) -> None:
    kinds = ("turns", "callbacks", "timers", "tasks", "to threads")
    print(f"{'mode':20s} {'side':4s} " + " ".join(f"{k:>10s}" for k in kinds))
    for mode, counts in found.items():
        for side in sides:
            values = counts[f"{side} counts"]
            print(f"{mode:20s} {side:4s} " + " ".join(f"{values.get(k, 0.0):10.2f}" for k in kinds))
        if not names or mode == "idle":
            continue
        called = [counts[f"{side} names"] for side in sides]
        for callback in sorted(set().union(*called)):
            per_side = [c.get(callback, 0.0) for c in called]
            if max(per_side) - min(per_side) >= 0.5 or (len(sides) == 1 and per_side[0] >= 0.5):
                print(f"    {' / '.join(f'{v:5.2f}' for v in per_side)}  {callback}")
    print("(per request; idle: per second. --names: callbacks whose count per request differs by 0.5 or more)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--a", type=Path, required=True, help="checkout A (the base)")
    parser.add_argument("--b", type=Path, default=HERE.parent, help="checkout B (default: this one)")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--modes", default="unary,stream,http_unary,http_stream", help=f"of {','.join(MODES)}")
    parser.add_argument("--names", action="store_true", help="the callbacks whose counts differ")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if unknown := [m for m in modes if m not in MODES]:
        parser.error(f"unknown modes {unknown}")
    out = Path(tempfile.mkdtemp(prefix="loop-counts-"))
    backend = _start(["bench.backend"], HERE.parent)
    processes = [backend]
    try:
        url = f"http://127.0.0.1:{_ready(backend)}/v1"
        sides: dict[str, Side] = {}
        for name, checkout in (("A", args.a), ("B", args.b)):
            sides[name] = Side(checkout.resolve(), url, out)
            processes.append(sides[name].process)
        found = asyncio.run(_count(sides, modes, args.requests))
    finally:
        for process in processes:
            process.terminate()
            process.wait()
    print(f"A: {args.a.resolve()}  B: {args.b.resolve()}")
    _report(found, list(sides), args.names)


if __name__ == "__main__":
    main()
