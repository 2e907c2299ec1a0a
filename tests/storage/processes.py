"""`antwort-grpc` as real processes for the storage tests: run from this checkout (whatever the
virtualenv's editable install points at), on loopback ports."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from antwort_grpc import pb

ROOT = Path(__file__).resolve().parents[2]


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "antwort_grpc.cli", *args]


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTWORT_")}
    return {**env, "PYTHONPATH": str(ROOT), "ANTWORT_SHUTDOWN_DRAIN": "0", **extra}


async def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, command(*args), capture_output=True, text=True, env=environment(), timeout=60
    )


@dataclass
class GatewayProcess:
    process: asyncio.subprocess.Process
    target: str
    channel: grpc.aio.Channel
    stub: Any  # pb.ResponsesServiceStub

    def kill(self) -> None:
        """kill -9: no shutdown, no final saves."""
        self.process.kill()


@asynccontextmanager
async def gateway_process(store: str, backend_url: str, **env: str) -> AsyncIterator[GatewayProcess]:
    """`antwort-grpc serve` on a free port against `store` and an OpenAI-compatible backend."""
    process = await asyncio.create_subprocess_exec(
        *command("serve", "--listen", "127.0.0.1:0", "--store", store, "--backend-url", backend_url),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=environment(ANTWORT_MODEL="fake-model", **env),
        cwd=ROOT,
    )
    assert process.stdout is not None
    target = ""
    output: list[str] = []
    async with asyncio.timeout(30):
        while not target:
            line = (await process.stdout.readline()).decode()
            assert line, "serve exited before it was ready:\n" + "".join(output)
            output.append(line)
            if "serving on" in line:
                target = line.rsplit(" ", 1)[1].strip()
    # Keep draining its output so a chatty process never blocks on a full pipe.
    drain = asyncio.create_task(_drain(process.stdout))
    channel = grpc.aio.insecure_channel(target)
    try:
        yield GatewayProcess(process, target, channel, pb.ResponsesServiceStub(channel))
    finally:
        await channel.close()
        if process.returncode is None:
            process.terminate()
            async with asyncio.timeout(20):
                await process.wait()
        drain.cancel()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass
