"""The Node example clients (examples/node; @grpc/grpc-js and @grpc/proto-loader from npm) against a
real gateway: one loads the .proto files, the other only the server's reflection. Stream, tool
round trip with google.protobuf.Struct parameters, BadRequest details, cancel."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from antwort_grpc.executors.base import FunctionExecutor
from antwort_grpc.providers.scripted import ScriptedProvider, Text
from antwort_grpc.storage.memory import MemoryStore
from tests.harness import running_gateway
from tests.interop.clients import assert_transcript, gateway_for_clients, line, run_client

ROOT = Path(__file__).resolve().parents[2]
NODE = ROOT / "examples/node"


@pytest.fixture(scope="module")
def node_modules() -> Path:
    """`npm ci` from the committed lockfile into examples/node/node_modules (gitignored), once per lockfile."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    assert not missing, f"{missing} missing: scripts/system-deps.sh installs them"
    stamp = (
        NODE / "node_modules" / f".installed-{hashlib.sha1((NODE / 'package-lock.json').read_bytes()).hexdigest()[:12]}"
    )
    if not stamp.exists():
        install = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE, capture_output=True, text=True, timeout=600
        )
        assert install.returncode == 0, install.stderr
        stamp.touch()
    return NODE / "node_modules"


@pytest.mark.parametrize("program", ["client.js", "reflection.js"])
async def test_node_client_streams_calls_a_tool_reads_bad_request_details_and_cancels(
    node_modules: Path, program: str
) -> None:
    async with gateway_for_clients() as (gw, fake):
        lines = await run_client(["node", str(NODE / program), gw.target])
    assert_transcript(lines, fake)
    assert lines[-1] == "get_missing: NOT_FOUND"


async def test_the_node_client_holds_its_conversation_with_the_gateway_make_run_tools_starts(
    node_modules: Path,
) -> None:
    """The examples need a model that calls tools: `make run-tools`'s scripted stand-in is one."""
    provider = ScriptedProvider.from_file(ROOT / "examples" / "tool_caller.json")
    async with running_gateway(provider=provider, executors=[FunctionExecutor()], store=MemoryStore()) as gw:
        lines = await run_client(["node", str(NODE / "client.js"), gw.target])
    assert line(lines, "completed:") == 'The tool answered: {"temp": 21}'
    assert lines[-1] == "get_missing: NOT_FOUND"


async def test_the_node_client_against_a_model_that_calls_no_tool_says_to_start_make_run_tools(
    node_modules: Path,
) -> None:
    provider = ScriptedProvider([[Text("I answer, I call nothing.")]], repeat=True)
    async with running_gateway(provider=provider, executors=[FunctionExecutor()], store=MemoryStore()) as gw:
        process = await asyncio.create_subprocess_exec(
            "node", str(NODE / "client.js"), gw.target, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 1
    assert "make run-tools" in out.decode().splitlines()[-1], out.decode()
