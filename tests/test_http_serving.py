"""Serving the HTTP door: its own address (a set address that cannot be bound is one startup line
naming the setting; the default one, taken, moves the door to a free port, loudly), TLS from the gRPC port's
files (mutual TLS with a client CA), no open address without authentication, and its health
answering what gRPC health answers when shutdown begins."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from antwort_grpc.config import GatewaySettings
from antwort_grpc.http.serving import door_settings, open_door
from antwort_grpc.providers.scripted import ScriptedProvider, Text
from tests.certs import authority
from tests.harness import running_gateway
from tests.test_cli import ANTWORT
from tests.test_startup_errors import assert_one_line, run


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "turns.json"
    path.write_text('{"turns": [[{"text": "hi"}]]}')
    return path


def test_a_set_http_address_in_use_is_one_line_naming_the_setting(script: Path, busy_port: int) -> None:
    result = run("serve", "--store", "memory", "--script", str(script), "--http-listen", f"127.0.0.1:{busy_port}")
    line = assert_one_line(result, "--http-listen / ANTWORT_HTTP_LISTEN")
    assert "in use" in line


def test_an_open_http_address_without_authentication_is_refused(script: Path) -> None:
    result = run("serve", "--store", "memory", "--script", str(script), "--http-listen", "0.0.0.0:0")
    line = assert_one_line(result, "0.0.0.0:0", "ANTWORT_AUTH")
    assert "refusing" in line


async def test_the_default_http_address_taken_moves_the_door_and_says_loudly_which_address_is_whose(
    busy_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    # A newcomer's curl to the default address must not be answered by another process unknowingly.
    provider = ScriptedProvider([[Text("hi")]], repeat=True)
    async with running_gateway(provider=provider) as gw:
        settings = GatewaySettings(http_listen=f"127.0.0.1:{busy_port}")
        settings.model_fields_set.discard("http_listen")  # as if left at its default
        with caplog.at_level(logging.WARNING):
            door = await open_door(settings, gw.gateway.core.front)
        assert door is not None
        try:
            assert door.port != busy_port
            [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
            assert f"127.0.0.1:{busy_port} is taken" in line and "another process" in line
            assert f"this gateway's Open Responses door is {door.url}" in line and "ANTWORT_HTTP_LISTEN" in line
            async with aiohttp.ClientSession() as session:
                body = {"model": "", "input": "hi"}
                async with session.post(door.url + "/v1/responses", json=body) as response:
                    assert (await response.json())["output"][0]["content"][0]["text"] == "hi"
        finally:
            await door.stop()
        off = GatewaySettings(http_listen="off")
        assert await open_door(off, gw.gateway.core.front) is None


async def test_the_http_door_serves_tls_from_the_grpc_ports_files_and_mutual_tls_with_a_client_ca(
    tmp_path: Path,
) -> None:
    ca = authority(tmp_path)
    server, client = ca.issue("gateway", server=True), ca.issue("client", server=False)
    provider = ScriptedProvider([[Text("over TLS")]], repeat=True)
    body = {"model": "", "input": "hi"}
    async with running_gateway(provider=provider) as gw:
        for client_ca in (None, ca.pem.cert):
            settings = GatewaySettings(
                http_listen="127.0.0.1:0", tls_cert=server.cert, tls_key=server.key, tls_client_ca=client_ca
            )
            assert door_settings(settings).tls_cert == server.cert
            door = await open_door(settings, gw.gateway.core.front)
            assert door is not None and door.url.startswith("https://")
            try:
                trusted = ssl.create_default_context(cafile=ca.pem.cert)
                if client_ca is not None:
                    trusted.load_cert_chain(client.cert, client.key)
                async with aiohttp.ClientSession() as session:
                    async with session.post(door.url + "/v1/responses", json=body, ssl=trusted) as response:
                        assert (await response.json())["output"][0]["content"][0]["text"] == "over TLS"
                    plain = door.url.replace("https://", "http://") + "/v1/responses"
                    with pytest.raises(aiohttp.ClientError):
                        async with session.post(plain, json=body) as response:
                            await response.read()
                    if client_ca is not None:
                        # No client certificate: the handshake is refused.
                        anonymous = ssl.create_default_context(cafile=ca.pem.cert)
                        with pytest.raises(aiohttp.ClientError):
                            async with session.post(door.url + "/v1/responses", json=body, ssl=anonymous) as r:
                                await r.read()
            finally:
                await door.stop()


def test_serve_help_names_the_http_flag() -> None:
    result = run("serve", "--help")
    assert "--http-listen" in result.stdout


async def test_http_health_says_draining_with_503_once_shutdown_begins_as_grpc_health_does(script: Path) -> None:
    # A load balancer probing the HTTP port must stop sending work when a SIGTERM starts the drain,
    # the moment the gRPC port's health goes NOT_SERVING.
    env = {**os.environ, "ANTWORT_SHUTDOWN_DRAIN": "60", "ANTWORT_LOG_LEVEL": "INFO"}
    proc = await asyncio.create_subprocess_exec(
        ANTWORT, "serve", "--listen", "127.0.0.1:0", "--store", "memory", "--script", str(script),
        "--http-listen", "127.0.0.1:0", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        target = url = ""
        async with asyncio.timeout(30):
            while not (target and url):
                line = (await proc.stdout.readline()).decode()
                assert line, "serve exited before it was ready"
                if "HTTP door listening on" in line:
                    url = line.split("listening on ", 1)[1].split()[0].rstrip('",}')
                elif "serving on" in line:
                    target = line.rsplit(" ", 1)[1].strip()
        async with aiohttp.ClientSession() as session, grpc.aio.insecure_channel(target) as channel:
            async with session.get(url + "/health") as response:
                assert (response.status, await response.json()) == (200, {"status": "ok"})
            proc.send_signal(signal.SIGTERM)
            health = health_pb2_grpc.HealthStub(channel)
            not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
            async with asyncio.timeout(20):
                async for answer in health.Watch(health_pb2.HealthCheckRequest()):
                    if answer.status == not_serving:
                        break
            async with session.get(url + "/health") as response:
                assert (response.status, await response.json()) == (503, {"status": "draining"})
            assert proc.returncode is None, "still draining: the doors stay open for the load balancers"
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
