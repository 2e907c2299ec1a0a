"""The doors' open connections are bounded (docs/limits.md, "Connections"): past the HTTP door's
bound a new connection is answered 503 with Retry-After and closed while gRPC still answers;
while the door is crowded, connections idle for their next request are closed to make room (a
request in progress never is); one address holds at most its share; and a gateway whose
descriptors are few keeps serving gRPC under a flood of idle HTTP connections (`antwort-grpc
serve` in a process of its own); and past the gRPC port's bound a new connection is closed while
the open ones serve. Real sockets on loopback ports throughout."""

from __future__ import annotations

import asyncio
import os
import re
import resource
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from antwort_grpc.http.connections import ConnectionGate
from antwort_grpc.http.door import DoorSettings
from antwort_grpc.open_files import door_bounds
from antwort_grpc.providers.scripted import ScriptedProvider, Text
from antwort_grpc.server.connections import connection_options
from tests.harness import running_gateway
from tests.http_harness import Doors, running_doors
from tests.test_admission import refused_counts
from tests.test_cli import ANTWORT

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]
SERVING = health_pb2.HealthCheckResponse.SERVING


@asynccontextmanager
async def connections(port: int, count: int, host: str = "127.0.0.1") -> AsyncIterator[list[Connection]]:
    """`count` connections opened to the door and left idle (nothing sent)."""
    opened: list[Connection] = []
    try:
        for _ in range(count):
            opened.append(await asyncio.open_connection("127.0.0.1", port, local_addr=(host, 0)))
        yield opened
    finally:
        for _, writer in opened:
            writer.close()
        for _, writer in opened:
            with suppress(ConnectionError):
                await writer.wait_closed()


async def answer(connection: Connection, request: bytes = b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n") -> str:
    """What the door answers on this connection to `request` ("" when it was closed unanswered)."""
    reader, writer = connection
    try:
        writer.write(request)
        await writer.drain()
        head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).decode()
    except (ConnectionError, asyncio.IncompleteReadError):
        return ""
    length = int(re.search(r"Content-Length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
    return head + (await reader.readexactly(length)).decode()


async def closed(connection: Connection) -> bool:
    reader, _ = connection
    try:
        return await asyncio.wait_for(reader.read(1), 10) == b""
    except ConnectionError:
        return True


async def grpc_health(target: str) -> int:
    async with grpc.aio.insecure_channel(target) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=20)
    return int(reply.status)


async def emptied(gate: ConnectionGate) -> None:
    """Until the door has seen every connection close (a wait, not a timing)."""
    for _ in range(1000):
        if not gate.open:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(gate.open)} connections still open")


@asynccontextmanager
async def door(metrics: bool = False, **settings: object) -> AsyncIterator[Doors]:
    provider = ScriptedProvider([[Text("hi")]], repeat=True)
    more = {"metrics_listen": "127.0.0.1:0"} if metrics else {}
    async with running_doors(DoorSettings(**settings), provider=provider, **more) as doors:  # type: ignore[arg-type]
        yield doors


async def test_past_the_door_bound_a_new_connection_gets_503_with_retry_after_while_grpc_answers() -> None:
    async with door(max_connections=8, max_connections_per_peer=0, pressure_idle_timeout=600) as doors:
        async with connections(doors.door.port, 8), connections(doors.door.port, 1) as (extra,):
            refused = await answer(extra)
            assert refused.startswith("HTTP/1.1 503 ")
            assert "Retry-After: 1" in refused
            assert '"code": "too_many_connections"' in refused
            assert await closed(extra)
            assert await grpc_health(doors.grpc.target) == health_pb2.HealthCheckResponse.SERVING
        # The idle ones gone, the door takes connections again.
        gate = doors.door.connections
        assert gate is not None
        await emptied(gate)
        async with connections(doors.door.port, 1) as (fresh,):
            assert (await answer(fresh)).startswith("HTTP/1.1 200 ")
        assert gate.refused == 1


async def test_a_crowded_door_closes_idle_connections_for_a_new_one_but_not_a_request_in_progress() -> None:
    async with door(max_connections=8, max_connections_per_peer=0, pressure_idle_timeout=0.2) as doors:
        port = doors.door.port
        async with connections(port, 7) as idle, connections(port, 1) as (busy,):
            # Kept alive after a request, and one in the middle of its body.
            for connection in idle:
                assert (await answer(connection)).startswith("HTTP/1.1 200 ")
            head = (
                b"POST /v1/responses HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n"
            )
            busy[1].write(head + b"{")
            await asyncio.sleep(0.5)
            async with connections(port, 1) as (fresh,):
                assert (await answer(fresh)).startswith("HTTP/1.1 200 ")
            for connection in idle:
                assert await closed(connection)
            # The request in progress goes on: the rest of its body is answered.
            busy[1].write(b"}")
            assert (await answer(busy, b"")).startswith("HTTP/1.1 400 ")
        assert doors.door.connections is not None and doors.door.connections.reaped == 7


async def test_one_address_holds_at_most_its_share_and_others_still_connect() -> None:
    async with door(True, max_connections=100, max_connections_per_peer=2, pressure_idle_timeout=600) as doors:
        port = doors.door.port
        async with connections(port, 2), connections(port, 1) as (third,):
            assert (await answer(third)).startswith("HTTP/1.1 503 ")
            async with connections(port, 1, host="127.0.0.2") as (other,):
                assert (await answer(other)).startswith("HTTP/1.1 200 ")
        # Counted with the requests refused before they started.
        refused = await refused_counts(doors.grpc)
    assert refused == {("HTTP connection", "UNAVAILABLE", "too_many_connections_per_peer"): 1}


def test_the_default_bounds_share_the_descriptors_between_the_doors() -> None:
    bounds = door_bounds(20_000)
    # A reserve stays for the store, the backend and the executors; neither door takes the other's.
    assert bounds.http + bounds.grpc + 2048 <= 20_000
    assert door_bounds(256).http + door_bounds(256).grpc < 256
    assert door_bounds(1 << 20).http == 10_000
    from antwort_grpc.config import GatewaySettings

    options = dict(connection_options(GatewaySettings(max_connections=50)))
    assert options["grpc.max_allowed_incoming_connections"] == 50
    assert "grpc.max_allowed_incoming_connections" not in dict(connection_options(GatewaySettings(max_connections=0)))


def _few_descriptors() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


async def test_idle_http_connections_past_the_descriptors_leave_grpc_serving(tmp_path: Path) -> None:
    """The failure seen: idle HTTP connections took every descriptor and new gRPC connections
    failed. Here the process may open 256 files and 300 idle connections come. (A scripted model:
    the gateway runs on uvloop, as with a backend URL.)"""
    script = tmp_path / "turns.json"
    script.write_text('{"turns": [[{"text": "hi"}]]}')
    proc = await asyncio.create_subprocess_exec(
        ANTWORT, "serve", "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--store", "memory",
        "--script", str(script),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "ANTWORT_SHUTDOWN_DRAIN": "0", "ANTWORT_LOG_LEVEL": "INFO"},
        preexec_fn=_few_descriptors,
    )  # fmt: skip
    assert proc.stdout is not None
    target = http = ""
    try:
        async with asyncio.timeout(60):
            while not target:
                line = (await proc.stdout.readline()).decode()
                assert line, "serve exited before it was ready"
                if "HTTP door listening on" in line:
                    http = line.rsplit(":", 1)[1].strip()
                if "serving on" in line:
                    target = line.rsplit(" ", 1)[1].strip()
        assert http, "no HTTP door"
        async with connections(int(http), 300) as opened:
            assert await grpc_health(target) == health_pb2.HealthCheckResponse.SERVING
            answers = await asyncio.gather(*(answer(c, b"") for c in opened[-20:]))
            assert any(a.startswith("HTTP/1.1 503 ") and "Retry-After" in a for a in answers), answers[:2]
            # Past the pressure wait, the address's idle connections make room for a fresh one.
            await asyncio.sleep(1.5)
            async with connections(int(http), 1) as (fresh,):
                assert (await answer(fresh)).startswith("HTTP/1.1 200 ")
    finally:
        proc.kill()
        await proc.wait()


async def test_past_its_bound_a_new_grpc_connection_is_closed_and_the_open_ones_serve() -> None:
    provider = ScriptedProvider([[Text("hi")]], repeat=True)
    own_pool = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own per channel
    async with running_gateway(provider=provider, max_connections=2) as gw:
        check = health_pb2.HealthCheckRequest()
        assert (await health_pb2_grpc.HealthStub(gw.channel).Check(check)).status == SERVING
        async with grpc.aio.insecure_channel(gw.target, options=own_pool) as second:
            assert (await health_pb2_grpc.HealthStub(second).Check(check)).status == SERVING
            async with grpc.aio.insecure_channel(gw.target, options=own_pool) as third:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await health_pb2_grpc.HealthStub(third).Check(check, timeout=5)
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            # The open ones still serve.
            assert (await health_pb2_grpc.HealthStub(second).Check(check)).status == SERVING
        # One closed, a new connection is taken (the client reconnects with backoff meanwhile).
        async with grpc.aio.insecure_channel(gw.target, options=own_pool) as fourth:
            reply = await health_pb2_grpc.HealthStub(fourth).Check(check, timeout=20, wait_for_ready=True)
        assert reply.status == SERVING
