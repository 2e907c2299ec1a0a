"""Executor services that accept only the gateway: a shared token, TLS with client certificates, and
what the model is told when an executor refuses or is gone. Real executor processes
(`antwort-grpc executor run`), a real gateway, certificates made with `cryptography`."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from antwort_grpc import pb
from antwort_grpc.config import ExecutorSettings, GatewaySettings
from antwort_grpc.executors.credentials import channel_credentials, read_token
from antwort_grpc.executors.remote import RemoteSettings
from antwort_grpc.providers.base import TurnRequest
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text
from tests.certs import authority
from tests.executors.remote_services import (
    ExecutorProcess,
    free_port,
    function,
    gateway_with_remote,
    start_process,
    stop_process,
    tool_outputs,
    tools_request,
)

ROOT = Path(__file__).resolve().parents[2]
CALCULATOR = "tests.executors.remote_services:Calculator"
TOKEN = "executor-token-7f3a9c"
SETTINGS = RemoteSettings(retry_interval=0.1, info_timeout=2.0, call_timeout=30.0)


@dataclass
class Running:
    executor: ExecutorProcess
    token_file: Path


@pytest.fixture
async def guarded(tmp_path: Path) -> AsyncIterator[Running]:
    """A calculator executor that wants the token (from a file, as a Kubernetes secret mounts it)."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    executor = await start_process(
        "executor", "run", CALCULATOR, "--listen", "127.0.0.1:0", env={"ANTWORT_EXECUTOR_TOKEN_FILE": str(token_file)}
    )
    try:
        yield Running(executor, token_file)
    finally:
        await stop_process(executor.proc)


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def test_with_a_token_configured_callers_without_it_are_unauthenticated_and_health_stays_open(
    guarded: Running,
) -> None:
    call = pb.ExecuteRequest(call=pb.FunctionCall(call_id="c1", name="add", arguments='{"a": 1, "b": 2}'))
    async with grpc.aio.insecure_channel(guarded.executor.target) as channel:
        stub = pb.ToolExecutorServiceStub(channel)
        for metadata in ((), _bearer("not-the-token"), (("authorization", TOKEN),)):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.GetExecutorInfo(pb.GetExecutorInfoRequest(), metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                async for _ in stub.Execute(call, metadata=metadata):
                    pass
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        info = await stub.GetExecutorInfo(pb.GetExecutorInfoRequest(), metadata=_bearer(TOKEN))
        assert [t.function.name for t in info.tools] == ["add"]
        updates = [u async for u in stub.Execute(call, metadata=_bearer(TOKEN))]
        assert updates[-1].result.output == "3"


def _add_then_report() -> ScriptedProvider:
    def report(turn: TurnRequest) -> list[Text]:
        return [Text(" | ".join(o.output for o in tool_outputs(turn)))]

    return ScriptedProvider([[Call.of("add", {"a": 2, "b": 3}, call_id="call_add")], report])  # type: ignore[list-item]


async def test_the_gateway_sends_its_token_from_the_token_file(
    guarded: Running,
) -> None:
    token = read_token(None, guarded.token_file, "ANTWORT_EXECUTOR_TOKEN")
    with_token = RemoteSettings(retry_interval=0.1, info_timeout=2.0, call_timeout=30.0, token=token)
    provider = _add_then_report()
    async with gateway_with_remote(provider, guarded.executor.target, with_token) as (gw, _):
        await gw.create(tools_request("add 2 and 3", [function("add")]))
    assert [(o.output, o.is_error) for o in tool_outputs(provider.requests[1])] == [("5", False)]


async def test_a_down_executor_is_an_error_result_that_names_no_address() -> None:
    port = free_port()
    target = f"127.0.0.1:{port}"
    executor = await start_process("executor", "run", CALCULATOR, "--listen", target)
    provider = _add_then_report()
    try:
        async with gateway_with_remote(provider, target, SETTINGS) as (gw, _):
            await stop_process(executor.proc)
            await gw.create(tools_request("add 2 and 3", [function("add")]))
    finally:
        await stop_process(executor.proc)
    [output] = tool_outputs(provider.requests[1])
    assert output.is_error
    assert "calculator" in output.output and "unavailable" in output.output
    assert str(port) not in output.output and "127.0.0.1" not in output.output


# Mutual TLS.


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path  # signed by another CA
    stranger_key: Path


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = authority(tmp_path, "executor-ca")
    server = ca.issue("executor", server=True)
    client = ca.issue("gateway", server=False)
    stranger = authority(tmp_path, "other-ca").issue("stranger", server=False)
    return Pki(ca.pem.cert, server.cert, server.key, client.cert, client.key, stranger.cert, stranger.key)


@pytest.fixture
async def mtls_executor(pki: Pki) -> AsyncIterator[ExecutorProcess]:
    env = {
        "ANTWORT_EXECUTOR_TLS_CERT": str(pki.server_cert),
        "ANTWORT_EXECUTOR_TLS_KEY": str(pki.server_key),
        "ANTWORT_EXECUTOR_TLS_CLIENT_CA": str(pki.ca),
    }
    executor = await start_process("executor", "run", CALCULATOR, "--listen", "127.0.0.1:0", env=env)
    try:
        yield executor
    finally:
        await stop_process(executor.proc)


async def _info(target: str, credentials: grpc.ChannelCredentials | None) -> pb.GetExecutorInfoResponse:
    channel = (
        grpc.aio.secure_channel(target, credentials) if credentials is not None else grpc.aio.insecure_channel(target)
    )
    async with channel:
        return await pb.ToolExecutorServiceStub(channel).GetExecutorInfo(pb.GetExecutorInfoRequest(), timeout=5)


@pytest.mark.parametrize("caller", ["plaintext", "no client certificate", "certificate of another CA"])
async def test_with_a_client_ca_only_callers_with_its_certificate_get_through(
    mtls_executor: ExecutorProcess, pki: Pki, caller: str
) -> None:
    credentials = {
        "plaintext": None,
        "no client certificate": channel_credentials(pki.ca, None, None),
        "certificate of another CA": channel_credentials(pki.ca, pki.stranger_cert, pki.stranger_key),
    }[caller]
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _info(mtls_executor.target, credentials)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_the_gateway_calls_an_mtls_executor_with_its_client_certificate(
    mtls_executor: ExecutorProcess, pki: Pki
) -> None:
    info = await _info(mtls_executor.target, channel_credentials(pki.ca, pki.client_cert, pki.client_key))
    assert info.name == "calculator"
    settings = RemoteSettings(
        retry_interval=0.1,
        info_timeout=2.0,
        call_timeout=30.0,
        credentials=channel_credentials(pki.ca, pki.client_cert, pki.client_key),
    )
    provider = _add_then_report()
    async with gateway_with_remote(provider, mtls_executor.target, settings) as (gw, _):
        await gw.create(tools_request("add 2 and 3", [function("add")]))
    assert [(o.output, o.is_error) for o in tool_outputs(provider.requests[1])] == [("5", False)]


def test_the_settings_have_the_documented_names(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in {
        "ANTWORT_EXECUTOR_TOKEN": "t",
        "ANTWORT_EXECUTOR_TOKEN_FILE": "/run/secrets/token",
        "ANTWORT_EXECUTOR_CA": "/ca.pem",
        "ANTWORT_EXECUTOR_CLIENT_CERT": "/gw.crt",
        "ANTWORT_EXECUTOR_CLIENT_KEY": "/gw.key",
        "ANTWORT_EXECUTOR_TLS_CERT": "/ex.crt",
        "ANTWORT_EXECUTOR_TLS_KEY": "/ex.key",
        "ANTWORT_EXECUTOR_TLS_CLIENT_CA": "/clients.pem",
    }.items():
        monkeypatch.setenv(name, value)
    gateway, executor = GatewaySettings(), ExecutorSettings()
    assert (gateway.executor_token, str(gateway.executor_token_file)) == ("t", "/run/secrets/token")
    assert [str(p) for p in (gateway.executor_ca, gateway.executor_client_cert, gateway.executor_client_key)] == [
        "/ca.pem",
        "/gw.crt",
        "/gw.key",
    ]
    assert (executor.token, str(executor.token_file)) == ("t", "/run/secrets/token")
    assert [str(p) for p in (executor.tls_cert, executor.tls_key, executor.tls_client_ca)] == [
        "/ex.crt",
        "/ex.key",
        "/clients.pem",
    ]


def test_a_token_and_a_token_file_together_are_a_startup_error(tmp_path: Path) -> None:
    from antwort_grpc.startup_errors import StartupError

    with pytest.raises(StartupError, match="not both"):
        read_token("a", tmp_path / "t", "ANTWORT_EXECUTOR_TOKEN")


# Listening beyond loopback.

ANTWORT = str(Path(sys.executable).parent / "antwort-grpc")
EVERY_INTERFACE = "0.0.0.0:0"


def _environment(extra: dict[str, str]) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("ANTWORT_")}, "PYTHONPATH": str(ROOT), **extra}


def _refused(listen: str, *flags: str, env: dict[str, str] | None = None) -> str:
    """The one stderr line of an executor that refuses to start."""
    command = [ANTWORT, "executor", "run", CALCULATOR, "--listen", listen, *flags]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30, cwd=ROOT, env=_environment(env or {}))
    assert result.returncode != 0 and "serving on" not in result.stdout
    [line] = result.stderr.splitlines()
    assert "Traceback" not in line
    return line


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "[::]:0", "192.0.2.1:0"])
def test_an_executor_without_a_token_or_mutual_tls_refuses_a_non_loopback_address_in_one_line(listen: str) -> None:
    line = _refused(listen)
    assert f"refusing to listen on {listen}" in line
    for setting in ("ANTWORT_EXECUTOR_TOKEN", "ANTWORT_EXECUTOR_TLS_CLIENT_CA", "--allow-unauthenticated"):
        assert setting in line, line


def test_tls_without_client_certificates_does_not_make_a_non_loopback_address_safe(pki: Pki) -> None:
    line = _refused(EVERY_INTERFACE, "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key))
    assert "refusing to listen on 0.0.0.0:0" in line


@pytest.mark.parametrize("guard", ["token", "mutual TLS", "allowed explicitly"])
def test_a_guarded_executor_serves_every_interface_and_logs_the_address_it_really_listens_on(
    guard: str, pki: Pki, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    flags, env = {
        "token": ([], {"ANTWORT_EXECUTOR_TOKEN_FILE": str(token_file)}),
        "mutual TLS": (
            ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key), "--tls-client-ca", str(pki.ca)],
            {},
        ),
        "allowed explicitly": (["--allow-unauthenticated"], {}),
    }[guard]
    log = tmp_path / "executor.log"
    command = [ANTWORT, "executor", "run", CALCULATOR, "--listen", EVERY_INTERFACE, *flags]
    with log.open("w") as stderr:
        process = subprocess.Popen(
            command, cwd=ROOT, env=_environment(env), stdout=subprocess.PIPE, stderr=stderr, text=True
        )
        try:
            assert process.stdout is not None
            serving = process.stdout.readline()
            assert "serving on" in serving, log.read_text()
        finally:
            process.terminate()
            process.wait(timeout=30)
    port = serving.strip().rsplit(":", 1)[1]
    text = log.read_text()
    assert f"listening on 0.0.0.0:{port}" in text and f"127.0.0.1:{port}" not in text, text
    warned = [line for line in text.splitlines() if " WARNING " in line and "every caller" in line]
    assert len(warned) == (1 if guard == "allowed explicitly" else 0), text


def test_the_explicit_setting_has_its_documented_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTWORT_EXECUTOR_ALLOW_UNAUTHENTICATED", "true")
    assert ExecutorSettings().allow_unauthenticated is True
