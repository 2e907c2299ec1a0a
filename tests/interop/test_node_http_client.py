"""The Node examples of the HTTP door (examples/node-http; the official OpenAI JS SDK from npm) against
a real gateway: on `make run-tools`'s scripted model a streamed conversation with a function-tool
round trip through previous_response_id, then a 404 as the SDK's NotFoundError; on the fake
OpenAI-compatible backend the SDK's structured-output helper (responses.parse with a zod schema)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from antwort_grpc.executors.base import FunctionExecutor
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.providers.scripted import ScriptedProvider
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply
from tests.http_harness import running_doors
from tests.interop.clients import line, run_client

ROOT = Path(__file__).resolve().parents[2]
NODE = ROOT / "examples/node-http"


@pytest.fixture(scope="module")
def node_modules() -> Path:
    """`npm ci` from the committed lockfile into examples/node-http/node_modules (gitignored), once per lockfile."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    assert not missing, f"{missing} missing: scripts/system-deps.sh installs them"
    lock = hashlib.sha1((NODE / "package-lock.json").read_bytes()).hexdigest()[:12]
    stamp = NODE / "node_modules" / f".installed-{lock}"
    if not stamp.exists():
        install = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE, capture_output=True, text=True, timeout=600
        )
        assert install.returncode == 0, install.stderr
        stamp.touch()
    return NODE / "node_modules"


async def test_the_openai_js_sdk_holds_a_streamed_conversation_with_a_tool_call(node_modules: Path) -> None:
    provider = ScriptedProvider.from_file(ROOT / "examples" / "tool_caller.json")
    async with running_doors(provider=provider, executors=[FunctionExecutor()], store=MemoryStore()) as doors:
        lines = await run_client(["node", str(NODE / "client.js"), doors.base_url])
    kinds = line(lines, "stream:").split()
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.done" in kinds
    assert line(lines, "call:") == 'get_weather {"city": "Paris"}'
    assert line(lines, "completed:") == 'The tool answered: {"temp":21}'
    assert line(lines, "previous:") == "true"
    assert lines[-1] == "get_missing: 404 NotFoundError"


async def test_the_openai_js_sdks_zod_helper_parses_structured_output(node_modules: Path) -> None:
    answer = '{"city": "Paris", "population": 2100000}'
    async with FakeOpenAI(Reply(text=answer)) as fake:
        provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model="fake-model", max_retries=0))
        try:
            async with running_doors(provider=provider, store=MemoryStore(), model="fake-model") as doors:
                lines = await run_client(["node", str(NODE / "structured.js"), doors.base_url])
        finally:
            await provider.aclose()
    assert line(lines, "status:") == "completed"
    assert line(lines, "parsed:") == '{"city":"Paris","population":2100000}'
    assert line(lines, "format:") == "json_schema city"
    # The zod schema reached the backend as response_format, strict as the helper asks.
    sent = fake.chat_requests[0]["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["name"] == "city"
    assert sent["json_schema"]["strict"] is True
    assert set(sent["json_schema"]["schema"]["properties"]) == {"city", "population"}
