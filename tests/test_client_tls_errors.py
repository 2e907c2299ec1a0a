"""`antwort-grpc ask` against a gateway it connects to the wrong way: each mismatch is one line
saying what is wrong and which flag fixes it, never "start it" for a gateway that is running.
`--cacert` (like `--cert` and `--key`) means TLS."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from antwort_grpc.config import GatewaySettings
from antwort_grpc.executors.base import FunctionExecutor
from antwort_grpc.gateway import Gateway, start_gateway
from antwort_grpc.providers.scripted import ScriptedProvider, Text
from antwort_grpc.storage.memory import MemoryStore
from tests.certs import Authority, authority
from tests.test_client_cli import ask


@asynccontextmanager
async def gateway(**tls: Path) -> AsyncIterator[Gateway]:
    settings = GatewaySettings(listen="127.0.0.1:0", model="m", **tls)
    provider = ScriptedProvider([[Text("over TLS")]], repeat=True)
    served = await start_gateway(settings, provider=provider, store=MemoryStore(), executors=[FunctionExecutor()])
    try:
        yield served
    finally:
        await served.stop(0)


@pytest.fixture
def ca(tmp_path: Path) -> Authority:
    return authority(tmp_path)


def one_line(out: str) -> str:
    assert out.strip().count("\n") == 0, out
    assert "start it" not in out and "Handshake failed" not in out, out
    return out.strip()


async def test_a_plaintext_client_at_a_tls_port_is_told_to_use_tls(ca: Authority) -> None:
    server = ca.issue("gateway", server=True)
    async with gateway(tls_cert=server.cert, tls_key=server.key) as gw:
        code, out = await ask("-t", gw.target, "--plaintext", "hi")
    assert code == 2
    assert "speaks TLS" in one_line(out) and "--tls" in out


async def test_a_tls_client_at_a_plaintext_port_is_told_to_use_plaintext(ca: Authority) -> None:
    async with gateway() as gw:
        code, out = await ask("-t", gw.target, "--tls", "hi")
    assert code == 2
    assert "does not speak TLS" in one_line(out) and "--plaintext" in out


async def test_a_client_without_a_certificate_at_a_mutual_tls_port_is_told_to_pass_one(ca: Authority) -> None:
    server = ca.issue("gateway", server=True)
    async with gateway(tls_cert=server.cert, tls_key=server.key, tls_client_ca=ca.pem.cert) as gw:
        code, out = await ask("-t", gw.target, "--cacert", str(ca.pem.cert), "hi")
        assert code == 2
        assert "requires a client certificate" in one_line(out) and "--cert and --key" in out
        # A plaintext client there hears both.
        code, out = await ask("-t", gw.target, "--plaintext", "hi")
        assert "speaks TLS" in one_line(out) and "client certificate" in out


async def test_a_server_certificate_from_another_ca_says_which_flag_names_the_ca(ca: Authority) -> None:
    server = ca.issue("gateway", server=True)
    other = authority(ca.directory, name="other-ca")
    async with gateway(tls_cert=server.cert, tls_key=server.key) as gw:
        code, out = await ask("-t", gw.target, "--cacert", str(other.pem.cert), "hi")
    assert code == 2
    assert "not signed by --cacert" in one_line(out)


async def test_cacert_alone_means_tls_even_for_a_loopback_target(ca: Authority) -> None:
    server = ca.issue("gateway", server=True)
    async with gateway(tls_cert=server.cert, tls_key=server.key) as gw:
        code, out = await ask("-t", gw.target, "--cacert", str(ca.pem.cert), "hi")
    assert code == 0 and out.startswith("over TLS\n"), out
    code, out = await ask("-t", gw.target, "--plaintext", "--cacert", str(ca.pem.cert), "hi")
    assert code == 2 and "--cacert need TLS" in one_line(out)
