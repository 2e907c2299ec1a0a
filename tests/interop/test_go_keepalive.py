"""A Go client with the keepalive docs/clients.md recommends (pings every 10 s, with or without
calls) holds a Converse stream idle at an approval for a minute — a real minute, on a gateway whose
connections also reach their maximum age meanwhile — and the stream is still usable after it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from antwort_grpc.executors.base import FunctionExecutor
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply
from tests.harness import running_gateway
from tests.interop.clients import WEATHER_CALL, line, run_client
from tests.interop.test_go_client import RUN, TOOLS

IDLE = 60


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_a_go_client_pinging_every_ten_seconds_holds_an_idle_converse_stream_for_a_minute(
    tmp_path: Path,
) -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    assert not missing, f"{missing} missing: scripts/system-deps.sh installs them (Debian's Go toolchain)"
    async with FakeOpenAI(Reply(tool_calls=[WEATHER_CALL]), strict=True) as fake:
        provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model="fake-model"))
        try:
            # The connection is aged out (GOAWAY) during the wait: the stream on it is not cut.
            async with running_gateway(
                provider=provider,
                executors=[FunctionExecutor()],
                store=MemoryStore(),
                model="fake-model",
                max_connection_age=IDLE / 3,
            ) as gw:
                lines = await run_client(
                    [str(RUN), "-hold-idle", f"{IDLE}s", gw.target],
                    env={"BUILD": str(tmp_path / "build")},
                    timeout=540,
                )
        finally:
            await provider.aclose()
    assert int(line(lines, "idle_waited:").rstrip("s")) >= IDLE
    assert line(lines, "idle_requires_action:") == "call_weather"
    assert line(lines, "idle_get:") == "RESPONSE_STATUS_REQUIRES_ACTION"
