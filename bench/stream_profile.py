"""Where a response's CPU goes, by part: py-spy on the gateway while one client sends requests one
after another (concurrency 1), the samples sorted into the parts of a response's path.

    python -m bench.stream_profile                                  # unary, stream, stream_uncoalesced
    python -m bench.stream_profile --modes stream --requests 3000

The gateway (`bench.gateway --provider openai`, memory store) answers 20 words from the bench
backend, as `bench.instructions` counts them; the modes are its modes. For each mode this prints
the gateway's CPU per request (from /proc, whole process) and, per part, its share of the event
loop's busy samples and that share of the CPU per request. A sample counts for the part of the
frame nearest the leaf that belongs to one; samples waiting in the selector, and grpc's poller
thread, are left out (py-spy cannot tell its waits from its work). Wall-clock sampling: run it
when the host is quiet, or read the shares rather than the times.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from antwort_grpc import pb
from bench.instructions import REQUESTS, _ready, _start
from bench.procs import cpu_seconds

WARM_UP = 50

# (part, markers): a frame belongs to the first part one of whose markers it contains.
PARTS: list[tuple[str, tuple[str, ...]]] = [
    (
        "backend decode (SSE, JSON chunks, deltas)",
        (
            "openai/sse.py",
            "openai/translate.py",
            "openai/wire.py",
            "_parse_chunk",
            "OpenAICompatProvider._feed",
            "pydantic",
            "msgspec",
            "providers/coalesce.py",
            "openai/decode.py",
        ),
    ),
    ("backend HTTP (aiohttp, request body)", ("aiohttp/", "openai/request.py", "openai/provider.py")),
    (
        "lifecycle events (created, in_progress, terminal)",
        (
            "ResponseEmitter.opening",
            "ResponseEmitter.created",
            "ResponseEmitter.in_progress",
            "ResponseEmitter.terminal",
            "ResponseEmitter._ended",
            "ResponseEmitter._copied",
            "ResponseEmitter._serialized",
            "ResponseEmitter._lifecycle",
            "take_wire",
            "engine/request.py",
        ),
    ),
    ("deltas, items and turn events (emitter)", ("engine/emitter.py",)),
    ("store", ("storage/",)),
    (
        "gRPC send (serialize, write)",
        (
            "EventMessage.",
            "protowire.py",
            "servicer.py:_message",
            "_message (",
            "front/batching.py",
            "decode.py:187",
            "decode.py:186",
            "unary_stream",
        ),
    ),
    ("engine (loop, turns, model call task)", ("engine/",)),
    ("servicer, edge, admission", ("server/", "edge.py", "responses/", "observability/", "auth/")),
    ("gRPC core (callbacks run by the loop)", ("Handle._run (asyncio/events.py:80)",)),
    ("asyncio", ("asyncio/", "selectors.py", "_weakrefset.py", "contextlib.py")),
]
_IDLE = ("EpollSelector.select (", "Thread.run (threading.py")


def part_of(frames: list[str]) -> str | None:
    """The part a sample counts for; None for one left out (waiting, or grpc's poller)."""
    if frames and frames[-1].startswith(_IDLE):
        return None
    if any(frame.startswith("Thread.run (threading.py") for frame in frames[:8]):
        return None
    for frame in reversed(frames):
        for part, markers in PARTS:
            if any(marker in frame for marker in markers):
                return part
    return "other"


def shares(folded: str) -> dict[str, float]:
    counts: collections.Counter[str] = collections.Counter()
    for line in folded.splitlines():
        stack, _, count = line.rpartition(" ")
        part = part_of(stack.split(";")) if stack else None
        if part is not None:
            counts[part] += int(count)
    busy = sum(counts.values()) or 1
    return {part: n / busy for part, n in counts.most_common()}


async def _drive(target: str, request: pb.CreateResponseRequest, count: int) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb.ResponsesServiceStub(channel)
        for _ in range(count):
            async for _ in stub.CreateResponse(request):
                pass


def profile(checkout: Path, mode: str, requests: int) -> tuple[float, dict[str, float]]:
    """(gateway CPU seconds per request, share of each part) for `requests` of `mode`."""
    out = Path(tempfile.mkdtemp(prefix="stream-profile-")) / f"{mode}.folded"
    backend = _start(["bench.backend"], checkout)
    gateway = None
    try:
        url = f"http://127.0.0.1:{_ready(backend)}/v1"
        gateway = _start(["bench.gateway", "--provider", "openai", "--backend-url", url], checkout)
        target = f"127.0.0.1:{_ready(gateway)}"
        asyncio.run(_drive(target, REQUESTS[mode](), WARM_UP))
        spy = Path(sys.executable).parent / "py-spy"
        sampler = subprocess.Popen(
            [str(spy), "record", "--pid", str(gateway.pid), "--rate", "500", "--nonblocking",
             "--format", "raw", "--output", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(1.0)  # py-spy attached
        before = cpu_seconds(gateway.pid)
        asyncio.run(_drive(target, REQUESTS[mode](), requests))
        cpu = (cpu_seconds(gateway.pid) - before) / requests
        sampler.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        sampler.wait()
    finally:
        for process in (gateway, backend):
            if process is not None:
                process.terminate()
                process.wait()
    return cpu, shares(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--modes", default="unary,stream,stream_uncoalesced", help=f"of {','.join(REQUESTS)}")
    args = parser.parse_args()
    results = {mode: profile(args.checkout.resolve(), mode, args.requests) for mode in args.modes.split(",")}
    parts = [part for part, _ in PARTS] + ["other"]
    print("| part | " + " | ".join(f"{mode}: % / µs" for mode in results) + " |")
    print("| --- |" + " ---: |" * len(results))
    for part in parts:
        cells = [f"{100 * s.get(part, 0):.1f} / {cpu * s.get(part, 0) * 1e6:.0f}" for cpu, s in results.values()]
        print(f"| {part} | " + " | ".join(cells) + " |")
    print("| CPU per request (µs) | " + " | ".join(f"{cpu * 1e6:.0f}" for cpu, _ in results.values()) + " |")


if __name__ == "__main__":
    main()
