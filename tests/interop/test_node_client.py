"""The Node example clients (examples/node; @grpc/grpc-js and @grpc/proto-loader from npm) against a
real gateway: one loads the .proto files, the other only the server's reflection. Stream, tool
round trip with google.protobuf.Struct parameters, BadRequest details, cancel."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.interop.clients import assert_transcript, gateway_for_clients, run_client

NODE = Path(__file__).resolve().parents[2] / "examples/node"


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
