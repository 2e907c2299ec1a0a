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

import asyncpg
import grpc

from antwort_grpc import pb

ROOT = Path(__file__).resolve().parents[2]


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "antwort_grpc.cli", *args]


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTWORT_")}
    # One process per replica: these tests kill, restart and compare replicas (test_workers.py
    # runs the workers of one gateway).
    return {**env, "PYTHONPATH": str(ROOT), "ANTWORT_SHUTDOWN_DRAIN": "0", "ANTWORT_WORKERS": "1", **extra}


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


class Stream:
    """A streaming CreateResponse read in the background, so a test can act mid-stream."""

    def __init__(self, gateway: GatewayProcess, request: pb.CreateResponseRequest) -> None:
        request.stream = True
        self.call = gateway.stub.CreateResponse(request)
        self.events: list[pb.StreamEvent] = []
        self._changed = asyncio.Condition()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.call:
            self.events.append(message.event)
            async with self._changed:
                self._changed.notify_all()

    @property
    def response_id(self) -> str:
        return self.events[0].created.response.id

    async def wait_for_deltas(self, count: int) -> None:
        def enough() -> bool:
            deltas = [e for e in self.events if e.WhichOneof("event") == "output_text_delta"]
            return len(deltas) >= count

        async with asyncio.timeout(20), self._changed:
            await self._changed.wait_for(enough)

    async def finished(self) -> list[pb.StreamEvent]:
        async with asyncio.timeout(20):
            await self.task
        return self.events


async def get(gateway: GatewayProcess, response_id: str) -> pb.Response:
    reply = await gateway.stub.GetResponse(pb.GetResponseRequest(response_id=response_id))
    response: pb.Response = reply.response
    return response


async def create(gateway: GatewayProcess, request: pb.CreateResponseRequest) -> pb.Response:
    """Non-streaming: the one message is the terminal event with the whole Response."""
    request.stream = False
    messages = [m async for m in gateway.stub.CreateResponse(request)]
    assert len(messages) == 1
    event = messages[0].event
    response: pb.Response = getattr(event, event.WhichOneof("event")).response
    return response


async def replica_gone(url: str, response_id: str) -> None:
    """Wait until the PostgreSQL session of the replica that ran a response has ended: take that
    replica's lock (it is granted once the server has closed the dead process's session)."""
    conn = await asyncpg.connect(url)
    try:
        instance = await conn.fetchval("SELECT instance FROM antwort_responses WHERE id = $1", response_id)
        async with asyncio.timeout(30):
            await conn.execute("SELECT pg_advisory_lock(hashtextextended($1, 0))", instance)
        await conn.execute("SELECT pg_advisory_unlock(hashtextextended($1, 0))", instance)
    finally:
        await conn.close()


@asynccontextmanager
async def status_changes(url: str) -> AsyncIterator[asyncio.Queue[tuple[str, int]]]:
    """Every status a row of the (migrated) database changes to, as it commits: a trigger that
    exists only in this test's schema NOTIFYs them."""
    conn = await asyncpg.connect(url)
    await conn.execute(
        """CREATE FUNCTION test_notify_status() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN PERFORM pg_notify('test_status', NEW.id || ' ' || NEW.status); RETURN NEW; END $$;
           CREATE TRIGGER test_status AFTER UPDATE OF status ON antwort_responses
           FOR EACH ROW EXECUTE FUNCTION test_notify_status();"""
    )
    queue: asyncio.Queue[tuple[str, int]] = asyncio.Queue()

    def heard(_conn: object, _pid: int, _channel: str, payload: object) -> None:
        response_id, status = str(payload).split()
        queue.put_nowait((response_id, int(status)))

    await conn.add_listener("test_status", heard)
    try:
        yield queue
    finally:
        await conn.close()
