"""CPU instructions per request of the gateway process, counted by callgrind: an A/B that does not
depend on the host's load or speed (the same commit gives the same count on any run).

    python -m bench.instructions                       # this checkout
    python -m bench.instructions --checkout ../base    # another checkout's gateway (a git worktree)

The gateway (`bench.gateway --provider openai`, memory store) runs under valgrind with
instrumentation off until 20 warm-up requests are done; then it counts `--requests` requests of
each of `--modes` (20 words each, the bench backend in a process of its own: `unary` not
streamed, `stream` streamed, `stream_uncoalesced` streamed with one event per backend chunk, `stream_batched` with
events produced together in one message), and
prints instructions per request for each. Needs valgrind (`apt-get install valgrind`). Only the
gateway process is counted: the backend and this client are not.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from antwort_grpc import pb

MODEL = "bench?words=20&delay=0&tools=0&stamp=0"
WARM_UP = 20


def _ready(process: subprocess.Popen[str]) -> int:
    assert process.stdout is not None
    while line := process.stdout.readline():
        if line.startswith("READY"):
            return int(line.split()[1])
    raise SystemExit(f"{process.args!r} ended before it was ready")


def _start(args: list[str], cwd: Path, valgrind: list[str] | None = None) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(cwd), PYTHONHASHSEED="0")
    return subprocess.Popen(
        [*(valgrind or []), sys.executable, "-m", *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE,  # the bench's processes stop when their stdin closes
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _request(stream: bool, **fields: Any) -> pb.CreateResponseRequest:
    return pb.CreateResponseRequest(model=MODEL, input_text="hello", stream=stream, **fields)


# What is counted, by name: the same answer not streamed, streamed (deltas coalesced, the
# default), and streamed with every backend chunk its own event (coalescing off).
REQUESTS: dict[str, Callable[[], pb.CreateResponseRequest]] = {
    "unary": lambda: _request(False),
    "stream": lambda: _request(True),
    "stream_uncoalesced": lambda: _request(True, delta_coalescing=pb.DeltaCoalescing(disabled=True)),
    # Events produced at the same moment in one message (a checkout whose contract has the field).
    "stream_batched": lambda: _request(True, batch_events=True),
    "stream_batched_uncoalesced": lambda: _request(
        True, batch_events=True, delta_coalescing=pb.DeltaCoalescing(disabled=True)
    ),
}
# The same answer through the Open Responses HTTP door (SSE streamed, or one JSON body).
HTTP_REQUESTS: dict[str, dict[str, Any]] = {
    "http_unary": {"model": MODEL, "input": "hello"},
    "http_stream": {"model": MODEL, "input": "hello", "stream": True},
}
MODES = [*REQUESTS, *HTTP_REQUESTS]


async def _http_once(session: Any, url: str, body: dict[str, Any]) -> None:
    async with session.post(url, json=body) as reply:
        assert reply.status == 200, await reply.text()
        await reply.read()


async def _drive(target: str, pid: int, requests: int, modes: list[str], http: str = "") -> None:
    import aiohttp

    def control(*what: str) -> None:
        subprocess.run(["callgrind_control", *what, str(pid)], check=True, capture_output=True)

    async with grpc.aio.insecure_channel(target) as channel, aiohttp.ClientSession() as session:
        stub = pb.ResponsesServiceStub(channel)
        for name in modes:
            for counted in (False, True):
                if counted:
                    control("-z")
                    control("-i", "on")
                for _ in range(requests if counted else WARM_UP):
                    if name in HTTP_REQUESTS:
                        await _http_once(session, f"{http}/v1/responses", HTTP_REQUESTS[name])
                        continue
                    async for _ in stub.CreateResponse(REQUESTS[name]()):
                        pass
            control("-i", "off")
            control("-d", name)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def measure(
    checkout: Path, requests: int, modes: list[str], observed: float = 0.0, metrics: bool = False
) -> dict[str, float]:
    """`observed`: metrics and traces on, this ratio of root traces sampled (parent-based), the
    spans exported to a receiver in a process of its own; 0: off. `metrics`: metrics alone."""
    out = Path(tempfile.mkdtemp(prefix="callgrind-"))
    backend = _start(["bench.backend"], checkout)
    sink = _start(["bench.otlp_sink"], checkout) if observed else None
    gateway = None
    try:
        url = f"http://127.0.0.1:{_ready(backend)}/v1"
        valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}/cg.%p"]
        args = ["bench.gateway", "--provider", "openai", "--backend-url", url]
        if metrics:
            args.append("--metrics")
        if sink is not None:
            endpoint = f"http://127.0.0.1:{_ready(sink)}"
            args += ["--metrics", "--otlp-endpoint", endpoint, "--trace-ratio", str(observed)]
        http = ""
        if any(mode in HTTP_REQUESTS for mode in modes):
            listen = f"127.0.0.1:{_free_port()}"
            args += ["--http-listen", listen]
            http = f"http://{listen}"
        gateway = _start(args, checkout, valgrind)
        asyncio.run(_drive(f"127.0.0.1:{_ready(gateway)}", gateway.pid, requests, modes, http))
    finally:
        for process in (gateway, backend, sink):
            if process is not None:
                process.terminate()
                process.wait()
    counts: dict[str, float] = {}
    for dump in glob.glob(f"{out}/cg.*"):
        text = Path(dump).read_text()
        trigger = re.search(r"^desc: Trigger: dump (\w+)$", text, re.M)
        totals = re.search(r"^totals: (\d+)", text, re.M)
        if trigger and totals:
            counts[trigger.group(1)] = int(totals.group(1)) / requests
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--modes", default="unary,stream,stream_uncoalesced", help=f"of {','.join(MODES)}")
    parser.add_argument("--observed", type=float, default=0.0, help="metrics + traces, this ratio sampled")
    parser.add_argument("--metrics", action="store_true", help="metrics alone")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if unknown := [m for m in modes if m not in MODES]:
        parser.error(f"unknown modes {unknown}")
    for name, count in sorted(
        measure(args.checkout.resolve(), args.requests, modes, args.observed, args.metrics).items()
    ):
        print(f"{args.checkout.name} {name}: {count / 1e6:.3f} M instructions per request")


if __name__ == "__main__":
    main()
