"""The HTTP door observed as the gRPC door is: an `antwort-grpc serve` process with JSON logs,
Prometheus metrics, OpenTelemetry traces and API keys; requests over HTTP with a `traceparent`
header and a bearer key get their span under the caller's trace, their line in the JSON log (the
principal and tenant of the key) and their count in the metrics."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path

import aiohttp

from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply
from tests.auth_fixtures import api_keys
from tests.executors.remote_services import ROOT, stop_process
from tests.otlp_receiver import otlp_receiver
from tests.test_tracing import CALLER_SPAN, CALLER_TRACE, otel_env


def free_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


async def test_http_requests_are_traced_logged_and_counted_like_grpc_ones(tmp_path: Path) -> None:
    credentials = api_keys(tmp_path)
    http, metrics = free_address(), free_address()
    log_file = tmp_path / "gateway.log"
    async with otlp_receiver() as (receiver, endpoint), FakeOpenAI(Reply(text="one"), Reply(text="two")) as backend:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ANTWORT_"))},
            **otel_env(endpoint, "gateway"),
            "PYTHONPATH": str(ROOT),
            "ANTWORT_SHUTDOWN_DRAIN": "0",
            "ANTWORT_AUTH": "api_key",
            "ANTWORT_API_KEYS_FILE": str(credentials.settings["api_keys_file"]),
        }
        args = ["--listen", "127.0.0.1:0", "--http-listen", http, "--metrics-listen", metrics]
        args += ["--store", "memory", "--backend-url", backend.url, "--model", "m3", "--log-format", "json"]
        with log_file.open("wb") as stderr:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "antwort_grpc.cli", "serve", *args,
                env=env, stdout=asyncio.subprocess.PIPE, stderr=stderr,
            )  # fmt: skip
        try:
            assert proc.stdout is not None
            await asyncio.wait_for(proc.stdout.readline(), 60)  # serving
            headers = {
                "Authorization": f"Bearer {credentials.tokens['alice']}",
                "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
            }
            ids = []
            async with aiohttp.ClientSession(f"http://{http}") as session:
                for stream in (False, True):
                    body = {"model": "", "input": "hello", "stream": stream}
                    async with session.post("/v1/responses", json=body, headers=headers) as response:
                        assert response.status == 200, await response.text()
                        if stream:
                            text = await response.text()
                            ids.append(json.loads(text.split("data: ", 1)[1].split("\n", 1)[0])["response"]["id"])
                        else:
                            ids.append((await response.json())["id"])
                async with session.get(f"http://{metrics}/metrics") as scrape:
                    exposition = await scrape.text()
            spans = await receiver.wait_for(lambda spans: sum(s.name.startswith("invoke_agent") for s in spans) == 2)
        finally:
            await stop_process(proc, graceful=True)
    agents = [s for s in spans if s.name.startswith("invoke_agent")]
    assert {s.trace_id for s in agents} == {CALLER_TRACE} and {s.parent_id for s in agents} == {CALLER_SPAN}
    assert {s.attributes["gen_ai.response.id"] for s in agents} == set(ids)
    assert {(s.attributes["http.request.method"], s.attributes["http.route"]) for s in agents} == {
        ("POST", "/v1/responses")
    }
    assert not any("rpc.system" in s.attributes for s in agents)
    records = [json.loads(line) for line in log_file.read_text().splitlines()]
    finished = [r for r in records if r["logger"] == "antwort_grpc.responses"]
    assert sorted(r["response_id"] for r in finished) == sorted(ids)
    assert {(r["principal"], r["tenant"], r["status"]) for r in finished} == {("alice", "acme", "completed")}
    counted = [line for line in exposition.splitlines() if line.startswith("antwort_responses_total")]
    assert counted and sum(float(line.rsplit(" ", 1)[1]) for line in counted) == 2, counted
