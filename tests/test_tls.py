"""TLS and mutual TLS on the gateway's port, with certificates made by the test."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from antwort_grpc import pb
from antwort_grpc.config import GatewaySettings
from antwort_grpc.executors.base import FunctionExecutor
from antwort_grpc.gateway import Gateway, start_gateway
from antwort_grpc.providers.scripted import ScriptedProvider, Text
from antwort_grpc.startup_errors import StartupError
from antwort_grpc.storage.memory import MemoryStore
from tests.certs import authority
from tests.harness import collect, user


async def _gateway(**tls: Path) -> Gateway:
    settings = GatewaySettings(listen="127.0.0.1:0", model="m", **tls)
    provider = ScriptedProvider([[Text("over TLS")]], repeat=True)
    return await start_gateway(settings, provider=provider, store=MemoryStore(), executors=[FunctionExecutor()])


async def _says_hello(channel: grpc.aio.Channel) -> str:
    events = await collect(pb.ResponsesServiceStub(channel).CreateResponse(user("hi"), timeout=10))
    return events[-1].completed.response.output[0].message.content[0].output_text.text


async def test_a_tls_gateway_answers_a_client_that_trusts_its_ca_and_no_plaintext_client(tmp_path: Path) -> None:
    ca = authority(tmp_path)
    server = ca.issue("gateway", server=True)
    gateway = await _gateway(tls_cert=server.cert, tls_key=server.key)
    try:
        trusted = grpc.ssl_channel_credentials(ca.pem.cert.read_bytes())
        async with grpc.aio.secure_channel(gateway.target, trusted) as channel:
            assert await _says_hello(channel) == "over TLS"
        async with grpc.aio.insecure_channel(gateway.target) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await _says_hello(channel)
            assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        other = authority(tmp_path / ".", "other-ca")
        async with grpc.aio.secure_channel(
            gateway.target, grpc.ssl_channel_credentials(other.pem.cert.read_bytes())
        ) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await _says_hello(channel)
            assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await gateway.stop(0)


async def test_with_a_client_ca_only_callers_with_a_certificate_it_signed_get_in(tmp_path: Path) -> None:
    ca = authority(tmp_path)
    server = ca.issue("gateway", server=True)
    client = ca.issue("client", server=False)
    strangers = authority(tmp_path, "strangers-ca")
    stranger = strangers.issue("stranger", server=False)
    gateway = await _gateway(tls_cert=server.cert, tls_key=server.key, tls_client_ca=ca.pem.cert)
    root = ca.pem.cert.read_bytes()
    try:
        with_cert = grpc.ssl_channel_credentials(root, client.key.read_bytes(), client.cert.read_bytes())
        async with grpc.aio.secure_channel(gateway.target, with_cert) as channel:
            assert await _says_hello(channel) == "over TLS"
        for credentials in (
            grpc.ssl_channel_credentials(root),
            grpc.ssl_channel_credentials(root, stranger.key.read_bytes(), stranger.cert.read_bytes()),
        ):
            async with grpc.aio.secure_channel(gateway.target, credentials) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
                assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await gateway.stop(0)


async def test_half_a_tls_configuration_is_refused(tmp_path: Path) -> None:
    ca = authority(tmp_path)
    with pytest.raises(StartupError, match="both"):
        await _gateway(tls_cert=ca.pem.cert)
    with pytest.raises(StartupError, match="needs ANTWORT_TLS_CERT"):
        await _gateway(tls_client_ca=ca.pem.cert)
