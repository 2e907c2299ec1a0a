"""Server-side tools end to end, every part its own process: `antwort-grpc serve` (configured with
`--executor` targets) against the fake OpenAI-compatible backend, `antwort-grpc executor sandbox`,
and `antwort-grpc executor mcp` bridging a real MCP server (official SDK, stdio)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from antwort_grpc import pb
from antwort_grpc.executors.remote import HEALTH_PREFIX
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply, ScriptedToolCall
from tests.executors.remote_services import (
    CODE_INTERPRETER,
    ExecutorProcess,
    mcp,
    start_process,
    stop_process,
    tools_request,
)
from tests.harness import assert_valid_stream, final, output_text

S = pb.ResponseStatus
MCP_SERVER = Path(__file__).with_name("e2e_mcp_server.py")
# As root the sandbox runs code as an unprivileged uid, which cannot reach the virtualenv's
# interpreter under /root: it runs the system's.
SANDBOX_PYTHON = "/usr/bin/python3" if os.geteuid() == 0 else sys.executable


@dataclass
class Executors:
    sandbox: ExecutorProcess
    bridge: ExecutorProcess
    # Files the test and the tools signal each other with (readable by the sandboxed code).
    markers: Path


@pytest.fixture
async def executors(tmp_path: Path) -> AsyncIterator[Executors]:
    # Not under pytest's tmp_path: the sandboxed code may run as another uid, which must be able
    # to reach the directory.
    markers = Path(tempfile.mkdtemp(prefix="antwort-e2e-"))
    os.chmod(markers, 0o755)
    config = tmp_path / "mcp-servers.json"
    server = {"label": "docs", "transport": "stdio", "command": sys.executable, "args": [str(MCP_SERVER), str(markers)]}
    config.write_text(json.dumps({"servers": [server]}))
    sandbox_env = {"ANTWORT_SANDBOX_READ_PATHS": str(markers), "ANTWORT_SANDBOX_PYTHON": SANDBOX_PYTHON}
    # Started side by side: each takes a few seconds (the sandbox's self-test, the MCP SDK).
    starts = await asyncio.gather(
        start_process("executor", "sandbox", "--listen", "127.0.0.1:0", env=sandbox_env),
        start_process("executor", "mcp", "--config", str(config), "--listen", "127.0.0.1:0"),
        return_exceptions=True,
    )
    started = [p for p in starts if isinstance(p, ExecutorProcess)]
    try:
        for outcome in starts:
            if isinstance(outcome, BaseException):
                raise outcome
        yield Executors(started[0], started[1], markers)
    finally:
        await asyncio.gather(*(stop_process(p.proc, graceful=True) for p in started))
        shutil.rmtree(markers, ignore_errors=True)


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as backend:
        yield backend


async def _gateway(fake: FakeOpenAI, executors: Executors) -> ExecutorProcess:
    return await start_process(
        "serve", "--listen", "127.0.0.1:0", "--store", "memory", "--backend-url", fake.url, "--model", "fake-model",
        "--executor", executors.sandbox.target, "--executor", executors.bridge.target,
    )  # fmt: skip


def _code_waiting_for(marker: Path) -> str:
    return (
        "import os, time\n"
        "deadline = time.monotonic() + 30\n"
        f"while not os.path.exists({str(marker)!r}):\n"
        "    if time.monotonic() > deadline:\n"
        "        raise SystemExit('the MCP call did not finish while this code ran')\n"
        "    time.sleep(0.01)\n"
        "print(sum(range(10)))\n"
    )


async def test_a_sandbox_tool_and_an_mcp_tool_called_in_one_turn_run_concurrently_and_return_in_the_models_order(
    fake: FakeOpenAI, executors: Executors
) -> None:
    markers = executors.markers
    # The sandboxed code finishes only after the MCP call's result reached the client, and the MCP
    # call answers only after the sandbox call started: only tools that run at the same time
    # complete. The model's order (code, then docs) is the opposite of the completion order.
    code = _code_waiting_for(markers / "mcp-result-seen")
    fake.add(
        Reply(
            text="Let me compute and check the docs.",
            tool_calls=[
                ScriptedToolCall(id="call_code", name="run_python", arguments=json.dumps({"code": code})),
                ScriptedToolCall(id="call_docs", name="lookup", arguments=json.dumps({"topic": "limits"})),
            ],
        ),
        Reply(text="The sum is 45, and each call is limited to 30 seconds."),
    )
    gateway = await _gateway(fake, executors)
    try:
        async with grpc.aio.insecure_channel(gateway.target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for executor in (executors.sandbox, executors.bridge):
                reply = await health.Check(health_pb2.HealthCheckRequest(service=HEALTH_PREFIX + executor.target))
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            request = tools_request(
                "What is sum(range(10)), and what do the docs say?", [CODE_INTERPRETER, mcp("docs")]
            )
            request.stream = True
            events: list[pb.StreamEvent] = []
            async for message in pb.ResponsesServiceStub(channel).CreateResponse(request, timeout=90):
                event = message.event
                events.append(event)
                which = event.WhichOneof("event")
                if which == "tool_execution_progress" and event.tool_execution_progress.call_id == "call_code":
                    (markers / "sandbox-running").touch()
                if which == "tool_execution_completed" and event.tool_execution_completed.call_id == "call_docs":
                    (markers / "mcp-result-seen").touch()
    finally:
        await stop_process(gateway.proc, graceful=True)

    assert_valid_stream(events)
    response = final(events)
    assert response.status == S.RESPONSE_STATUS_COMPLETED, response.error
    # Concurrency, read off the stream: the sandbox call started, then the MCP call finished,
    # then the sandbox call finished.
    milestones = [
        (e.WhichOneof("event"), getattr(e, e.WhichOneof("event") or "").call_id)
        for e in events
        if e.WhichOneof("event") in ("tool_execution_progress", "tool_execution_completed", "tool_execution_failed")
    ]
    assert milestones.index(("tool_execution_progress", "call_code")) < milestones.index(
        ("tool_execution_completed", "call_docs")
    )
    assert milestones.index(("tool_execution_completed", "call_docs")) < milestones.index(
        ("tool_execution_completed", "call_code")
    )
    # The output: the calls, their outputs in the model's order, then the model's final answer.
    items = [(i.WhichOneof("kind"), i) for i in response.output]
    assert [k for k, _ in items] == [
        "message",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
        "message",
    ]
    assert [i.function_call.call_id for k, i in items if k == "function_call"] == ["call_code", "call_docs"]
    outputs = [i.function_call_output for k, i in items if k == "function_call_output"]
    assert [o.call_id for o in outputs] == ["call_code", "call_docs"]
    assert not any(o.is_error for o in outputs), [o.output for o in outputs]
    sandbox_result = json.loads(outputs[0].output)
    assert (sandbox_result["exit_code"], sandbox_result["stdout"].strip()) == (0, "45")
    assert outputs[1].output == "the docs on limits: every call is limited to 30 seconds"
    assert output_text(response).endswith("The sum is 45, and each call is limited to 30 seconds.")
    # The model was offered exactly the tools of what the request named, and got both results
    # back, in its own order, on the second turn.
    first, second = fake.chat_requests
    assert sorted(t["function"]["name"] for t in first["tools"]) == ["lookup", "run_python", "version"]
    tool_messages = [m for m in second["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["call_code", "call_docs"]
