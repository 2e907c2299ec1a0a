"""grpcio's C core writes its own lines to stderr (a failed TLS handshake, say). A gateway passes
them through its log format like its own records: with `--log-format json` every line on stdout
and stderr is one JSON object — the "serving on" line, grpcio's handshake lines, and the one line
a failed start ends with."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import grpc

from antwort_grpc import pb
from tests.certs import authority
from tests.executors.remote_services import ROOT, stop_process

SCRIPT = ROOT / "examples" / "tool_caller.json"


def gateway_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTWORT_", "OTEL_", "GRPC_"))}
    return {**env, "PYTHONPATH": str(ROOT), "ANTWORT_SHUTDOWN_DRAIN": "0", **extra}


async def serve_and_knock_in_plaintext(tmp_path: Path, log_format: str) -> tuple[list[str], list[str]]:
    """A TLS gateway that a plaintext client tries once; its stdout and stderr lines."""
    ca = authority(tmp_path)
    server = ca.issue("gateway", server=True)
    env = gateway_env(ANTWORT_TLS_CERT=str(server.cert), ANTWORT_TLS_KEY=str(server.key))
    args = ["--listen", "127.0.0.1:0", "--store", "memory", "--script", str(SCRIPT), "--log-format", log_format]
    err = tmp_path / "stderr.log"
    with err.open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "antwort_grpc.cli", "serve", *args,
            env=env, stdout=asyncio.subprocess.PIPE, stderr=stderr,
        )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        target = first.rsplit(" ", 1)[-1].strip() if log_format == "text" else json.loads(first)["target"]
        async with grpc.aio.insecure_channel(target) as channel:
            try:
                await pb.ResponsesServiceStub(channel).GetResponse(pb.GetResponseRequest(response_id="r"), timeout=5)
            except grpc.aio.AioRpcError as error:
                assert error.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await stop_process(proc, graceful=True)
    rest = (await proc.stdout.read()).decode()
    return [first.rstrip("\n"), *rest.splitlines()], err.read_text().splitlines()


async def test_with_json_logs_every_line_on_stdout_and_stderr_is_json_grpcs_handshake_lines_included(
    tmp_path: Path,
) -> None:
    out, err = await serve_and_knock_in_plaintext(tmp_path, "json")
    records = [json.loads(line) for line in out + err]  # every line is one JSON object
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    assert json.loads(out[0])["message"].startswith("antwort-grpc serving on")
    handshakes = [r for r in records if r["logger"] == "grpc" and "Handshake failed" in r["message"]]
    assert handshakes and handshakes[0]["source"].startswith("ssl_transport_security")


async def test_with_text_logs_grpcs_handshake_lines_are_in_the_text_format(tmp_path: Path) -> None:
    _, err = await serve_and_knock_in_plaintext(tmp_path, "text")
    handshakes = [line for line in err if "Handshake failed" in line]
    assert handshakes and all(" INFO grpc: Handshake failed" in line for line in handshakes), err


async def test_a_start_that_fails_with_json_logs_ends_with_one_json_line_naming_the_setting() -> None:
    env = gateway_env(ANTWORT_BACKEND_HEADERS="{bad", ANTWORT_LOG_FORMAT="json")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "antwort_grpc.cli", "serve", "--script", str(SCRIPT),
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2 and out == b""
    [line] = err.decode().splitlines()
    record = json.loads(line)
    assert record["level"] == "ERROR" and "ANTWORT_BACKEND_HEADERS" in record["message"]
