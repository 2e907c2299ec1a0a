"""The Go example client (examples/go; grpc-go, code generated from protos/ with their go_package)
against a real gateway: stream, tool round trip, BadRequest details, cancel."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.interop.clients import assert_transcript, gateway_for_clients, run_client

RUN = Path(__file__).resolve().parents[2] / "examples/go/run.sh"
TOOLS = ("go", "protoc", "protoc-gen-go", "protoc-gen-go-grpc")


async def test_go_client_streams_calls_a_tool_reads_bad_request_details_and_cancels(tmp_path: Path) -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    assert not missing, f"{missing} missing: scripts/system-deps.sh installs them (Debian's Go toolchain)"
    async with gateway_for_clients() as (gw, fake):
        lines = await run_client([str(RUN), gw.target], env={"BUILD": str(tmp_path / "build")}, timeout=600)
    assert_transcript(lines, fake)
    assert lines[-1] == "get_missing: NOT_FOUND"
