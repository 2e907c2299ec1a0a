"""The Java example client (examples/java; javac and Debian's grpc-java, StatusProto from
proto-google-common-protos) against a real gateway: stream, tool round trip, BadRequest details,
cancel."""

from __future__ import annotations

from pathlib import Path

from tests.interop.clients import assert_transcript, gateway_for_clients, run_client

ROOT = Path(__file__).resolve().parents[2]


async def test_java_client_streams_calls_a_tool_reads_bad_request_details_and_cancels(tmp_path: Path) -> None:
    async with gateway_for_clients() as (gw, fake):
        command = [str(ROOT / "examples/java/run.sh"), gw.target]
        lines = await run_client(command, env={"BUILD": str(tmp_path / "build")}, timeout=600)
    assert_transcript(lines, fake)
    assert lines[-1] == "get_missing: NOT_FOUND"
