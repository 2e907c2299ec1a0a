"""`antwort-grpc serve` as a real process: flags and environment, and SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc

from antwort_grpc import pb
from antwort_grpc.cli import gateway_settings, main
from antwort_grpc.config import GatewaySettings
from antwort_grpc.engine import EngineConfig
from tests.harness import assert_valid_stream, collect, final, kinds

ANTWORT = str(Path(sys.executable).parent / "antwort-grpc")


def test_turn_limit_defaults_to_ten_and_is_configurable(monkeypatch: object) -> None:
    assert EngineConfig().max_turns == 10
    assert GatewaySettings().max_turns == 10
    os.environ["ANTWORT_MAX_TURNS"] = "4"
    try:
        assert GatewaySettings().max_turns == 4
        import argparse

        args = argparse.Namespace(max_turns=7)
        assert gateway_settings(args).max_turns == 7, "a flag wins over the environment"
    finally:
        del os.environ["ANTWORT_MAX_TURNS"]


def test_executors_come_from_a_comma_separated_variable_or_repeated_flags() -> None:
    os.environ["ANTWORT_EXECUTORS"] = "sandbox:50061, mcp:50062"
    try:
        assert GatewaySettings().executors == ["sandbox:50061", "mcp:50062"]
    finally:
        del os.environ["ANTWORT_EXECUTORS"]
    import argparse

    assert gateway_settings(argparse.Namespace(executors=["a:1", "b:2"])).executors == ["a:1", "b:2"]


def test_help_lists_the_commands(capsys: object) -> None:
    import pytest

    with pytest.raises(SystemExit):
        main(["--help"])


@asynccontextmanager
async def serve_process(tmp_path: Path, *args: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    proc = await asyncio.create_subprocess_exec(
        ANTWORT, "serve", "--listen", "127.0.0.1:0", "--store", "memory", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "ANTWORT_SHUTDOWN_DRAIN": "0"},
    )  # fmt: skip
    assert proc.stdout is not None
    target = ""
    async with asyncio.timeout(30):
        while not target:
            line = (await proc.stdout.readline()).decode()
            assert line, "serve exited before it was ready"
            if "serving on" in line:
                target = line.rsplit(" ", 1)[1].strip()
    try:
        yield proc, target
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_serve_runs_a_scripted_conversation_and_stops_on_sigterm(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [[{"text": "Hello from the script."}]], "repeat": True}))
    async with serve_process(tmp_path, "--script", str(script), "--model", "scripted") as (proc, target):
        async with grpc.aio.insecure_channel(target) as channel:
            stub = pb.ResponsesServiceStub(channel)
            events = await collect(stub.CreateResponse(pb.CreateResponseRequest(input_text="hi", stream=True)))
        assert_valid_stream(events)
        assert kinds(events)[-1] == "completed"
        assert final(events).model == "scripted"
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            code = await proc.wait()
        assert code == 0
