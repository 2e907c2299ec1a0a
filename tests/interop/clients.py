"""What every example client (Go, Java, Node) is run against and must print.

The gateway is real (a loopback port) and talks to the fake OpenAI-compatible backend in strict
mode, scripted to call a tool. Each client holds the same conversation and prints one transcript
line per step, so one check applies to all of them:

    stream: created in_progress … completed     the event kinds of a streamed answer
    text: Bonjour !                             its text
    requires_action: call_weather get_weather {"city": "Paris"}
    completed: It is 21 °C and sunny in Paris.  after the client sent its tool result
    bad_request: INVALID_ARGUMENT temperature: must be between 0 and 2   (google.rpc.BadRequest)
    cancelled: RESPONSE_STATUS_CANCELLED        CancelResponse while a slow answer streams
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from antwort_grpc.executors.base import FunctionExecutor
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply, ScriptedToolCall
from tests.harness import GatewayClient, running_gateway

WEATHER_CALL = ScriptedToolCall(id="call_weather", name="get_weather", arguments='{"city": "Paris"}', fragments=3)
SCRIPT = [
    Reply(text="Bonjour !"),
    Reply(tool_calls=[WEATHER_CALL]),
    Reply(text="It is 21 °C and sunny in Paris."),
    # Slow enough that the client cancels it after its first words.
    Reply(text="A long story " + "and so on " * 200, delay=0.05),
]


@asynccontextmanager
async def gateway_for_clients(*extra: Reply) -> AsyncIterator[tuple[GatewayClient, FakeOpenAI]]:
    async with FakeOpenAI(*SCRIPT, *extra, strict=True) as fake:
        provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model="fake-model"))
        try:
            async with running_gateway(
                provider=provider, executors=[FunctionExecutor()], store=MemoryStore(), model="fake-model"
            ) as gw:
                yield gw, fake
        finally:
            await provider.aclose()


async def run_client(command: Sequence[str], env: dict[str, str] | None = None, timeout: float = 120) -> list[str]:
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env={**os.environ, **(env or {})}
    )
    out, _ = await asyncio.wait_for(process.communicate(), timeout)
    lines = out.decode().splitlines()
    assert process.returncode == 0, "\n".join(lines)
    return lines


def line(lines: list[str], prefix: str) -> str:
    found = [text.removeprefix(prefix).strip() for text in lines if text.startswith(prefix)]
    assert found, f"no {prefix!r} line in:\n" + "\n".join(lines)
    return found[0]


def assert_transcript(lines: list[str], fake: FakeOpenAI) -> None:
    kinds = line(lines, "stream:").split()
    assert kinds[:2] == ["created", "in_progress"] and kinds[-1] == "completed", kinds
    assert "output_text_delta" in kinds
    assert line(lines, "text:") == "Bonjour !"
    assert line(lines, "requires_action:") == 'call_weather get_weather {"city": "Paris"}'
    assert line(lines, "completed:") == "It is 21 °C and sunny in Paris."
    assert line(lines, "bad_request:") == "INVALID_ARGUMENT temperature: must be between 0 and 2"
    assert line(lines, "cancelled:") == "RESPONSE_STATUS_CANCELLED"
    # The client's tool result reached the model, right after its call.
    continued = fake.chat_requests[2]["messages"]
    assert continued[-1] == {"role": "tool", "tool_call_id": "call_weather", "content": '{"temp": 21}'}
    sent_tool = fake.chat_requests[1]["tools"][0]["function"]
    assert sent_tool["parameters"] == {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    }, json.dumps(sent_tool)
