"""The Go example client (examples/go; grpc-go, code generated from protos/ with their go_package)
against a real gateway: stream, tool round trip, BadRequest details, cancel, and a Converse
session that steers a streaming answer, approves a call and answers it."""

from __future__ import annotations

import shutil
from pathlib import Path

from antwort_grpc.testing.fake_openai import Reply
from tests.interop.clients import WEATHER_CALL, assert_transcript, gateway_for_clients, line, run_client

RUN = Path(__file__).resolve().parents[2] / "examples/go/run.sh"
TOOLS = ("go", "protoc", "protoc-gen-go", "protoc-gen-go-grpc")


CONVERSE = [
    Reply(text="Once upon a time " + "there was a story " * 300, delay=0.02),  # steered mid-stream
    Reply(tool_calls=[WEATHER_CALL]),  # needs an approval, then is the client's to run
    Reply(text="Short: 21 °C in Paris."),
    Reply(text="Once upon a time there was a gateway that kept its runs.", delay=0.05),  # dropped, re-attached
]


async def test_go_client_streams_calls_a_tool_reads_bad_request_details_cancels_and_converses(tmp_path: Path) -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    assert not missing, f"{missing} missing: scripts/system-deps.sh installs them (Debian's Go toolchain)"
    async with gateway_for_clients(*CONVERSE) as (gw, fake):
        lines = await run_client([str(RUN), gw.target], env={"BUILD": str(tmp_path / "build")}, timeout=600)
    assert_transcript(lines, fake)
    # It asks for batched events: the streamed answer's events came in fewer messages.
    assert int(line(lines, "stream_messages:")) < len(line(lines, "stream:").split())
    assert line(lines, "converse_steered:") == "Make it short, and check the weather."
    assert line(lines, "converse_approval:") == 'call_weather get_weather {"city": "Paris"}'
    assert line(lines, "converse_requires_action:") == "call_weather"
    assert line(lines, "converse_completed:") == "Short: 21 °C in Paris."
    kinds = line(lines, "converse:").split()
    for interactive in ("turn_started", "input_injected", "approval_requested", "turn_completed"):
        assert interactive in kinds, kinds
    # The steer reached the model right after the cut-off text; the approved call's result after its call.
    steered = fake.chat_requests[5]["messages"]
    assert steered[-1] == {"role": "user", "content": "Make it short, and check the weather."}
    answered = fake.chat_requests[6]["messages"]
    assert answered[-1] == {"role": "tool", "tool_call_id": "call_weather", "content": '{"temp": 21}'}
    # The background story: read to sequence number 5, dropped, read on from 6 to its end.
    assert line(lines, "reattached:") == "5 completed Once upon a time there was a gateway that kept its runs."
    assert lines[-1] == "get_missing: NOT_FOUND antwort.v1.Response resp_missing"
