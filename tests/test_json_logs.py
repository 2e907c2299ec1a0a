"""`--log-format json`: a gateway process writes every log record as one JSON object and one line
per finished response (id, principal, model, status, turns, tool calls, tokens, duration, trace
id) without any message content."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import grpc

from antwort_grpc import pb
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply
from tests.auth_fixtures import api_keys
from tests.executors.remote_services import ROOT, stop_process
from tests.harness import collect
from tests.otlp_receiver import otlp_receiver
from tests.test_tracing import otel_env

SECRET_PROMPT = "my-secret-prompt-words"
SECRET_ANSWER = "confidential-answer-text"


async def test_json_logs_have_one_line_per_finished_response_and_no_content(tmp_path: Path) -> None:
    credentials = api_keys(tmp_path)
    backend = FakeOpenAI(
        Reply(text=f"{SECRET_ANSWER} one", completion_tokens=5), Reply(text=f"{SECRET_ANSWER} two", completion_tokens=4)
    )
    log_file = tmp_path / "gateway.log"
    async with otlp_receiver() as (receiver, endpoint), backend:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ANTWORT_"))},
            **otel_env(endpoint, "gateway"),
            "PYTHONPATH": str(ROOT),
            "ANTWORT_SHUTDOWN_DRAIN": "0",
            "ANTWORT_AUTH": "api_key",
            "ANTWORT_API_KEYS_FILE": str(credentials.settings["api_keys_file"]),
        }
        args = ["--listen", "127.0.0.1:0", "--store", "memory", "--backend-url", backend.url, "--model", "m2"]
        with log_file.open("wb") as stderr:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "antwort_grpc.cli",
                "serve",
                "--log-format",
                "json",
                *args,
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
            )
        try:
            assert proc.stdout is not None
            line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
            target = json.loads(line)["target"]  # stdout is JSON too
            ids = []
            async with grpc.aio.insecure_channel(target) as channel:
                stub = pb.ResponsesServiceStub(channel)
                for stream in (True, False):
                    request = pb.CreateResponseRequest(input_text=f"{SECRET_PROMPT}", stream=stream)
                    events = await collect(stub.CreateResponse(request, metadata=credentials.of("alice"), timeout=30))
                    ids.append(events[-1].completed.response.id)
            await receiver.wait_for(lambda spans: sum(s.name.startswith("invoke_agent") for s in spans) == 2)
        finally:
            await stop_process(proc, graceful=True)
    lines = log_file.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    finished = [r for r in records if r["logger"] == "antwort_grpc.responses"]
    assert [r["response_id"] for r in finished] == ids
    traces = {s.span_id: s.trace_id for s in receiver.spans if s.name.startswith("invoke_agent")}
    for record, tokens in zip(finished, (5, 4), strict=True):
        assert record["principal"] == "alice" and record["tenant"] == "acme"
        assert (record["model"], record["status"], record["turns"], record["tool_calls"]) == ("m2", "completed", 1, 0)
        assert record["input_tokens"] == 7 and record["output_tokens"] == tokens
        assert record["duration_ms"] > 0
        assert record["trace_id"] in traces.values()
    text = log_file.read_text()
    assert SECRET_PROMPT not in text and SECRET_ANSWER not in text
