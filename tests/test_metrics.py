"""Prometheus metrics of the gateway, scraped by a real Prometheus server while a few
conversations run (a server-side tool on a real executor service, a streamed answer, a backend
failure), checked with PromQL over its HTTP API; the exposition passes `promtool check metrics`.
Every RPC is counted by its status and timed, the requests refused before they started are counted
by reason, and the process reports its CPU, memory and file descriptors. A gateway process
against the fake OpenAI-compatible backend records a model call the same, streamed or not, in its
metrics and in the spans it exports to a real OTLP receiver."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from antwort_grpc import pb
from antwort_grpc.executors.base import FunctionExecutor
from antwort_grpc.executors.remote import RemoteExecutor
from antwort_grpc.observability.metrics import Metrics
from antwort_grpc.observability.wrappers import ObservedProvider
from antwort_grpc.providers.base import ProviderError, TurnEnd, TurnRequest
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text, Turn
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply
from antwort_grpc.tool_services.sdk import serve_executor
from tests.auth_fixtures import api_keys
from tests.executors.remote_services import FAST, Forecasts, free_port, start_process, stop_process, tools_request
from tests.harness import collect, running_gateway, user
from tests.otlp_receiver import otlp_receiver
from tests.prometheus_server import Vector, prometheus, promtool_check_metrics

S = pb.ResponseStatus


def _script(request: TurnRequest) -> Turn | Sequence[Call | Text]:
    """Each conversation by its first words: weather (a tool round), story (streamed text), broken."""
    text = request.items[0].message.content[0].input_text.text if request.items else ""
    answered = any(i.WhichOneof("kind") == "function_call_output" for i in request.items)
    if text.startswith("weather"):
        return [Text("It is sunny.")] if answered else [Call.of("get_weather", {"city": "Paris"})]
    if text.startswith("broken"):
        return Turn(error=ProviderError("rate_limited", "the backend is busy"))
    return Turn([Text("once upon a time there was a gateway")], usage=pb.Usage(input_tokens=7, output_tokens=9))


def values(result: Vector, label: str) -> dict[str, float]:
    return {sample["metric"].get(label, ""): float(sample["value"][1]) for sample in result}


async def test_prometheus_scrapes_the_gateway_during_conversations(tmp_path: Path) -> None:
    provider = ScriptedProvider([_script], repeat=True)
    service = await serve_executor(Forecasts())
    remote = RemoteExecutor(service.target, FAST)
    await remote.start()
    try:
        async with running_gateway(
            provider=provider, executors=[FunctionExecutor(), remote], metrics_listen="127.0.0.1:0"
        ) as gw:
            port = gw.gateway.metrics_port
            assert port
            async with prometheus(tmp_path, [f"127.0.0.1:{port}"]) as prom:
                weather = tools_request("weather in Paris?", [pb.Tool(function=pb.FunctionTool(name="get_weather"))])
                for request in (weather, user("story please"), user("story again"), user("broken on purpose")):
                    await gw.stream(request)
                weather_response = await gw.create(weather)
                assert weather_response.status == S.RESPONSE_STATUS_COMPLETED
                # A response on a Converse stream (its events are written, not yielded, by the servicer).
                session = gw.stub.Converse(iter([pb.ConverseRequest(create=user("story on a session"))]))
                ends = [m.event.WhichOneof("event") async for m in session if m.WhichOneof("message") == "event"]
                assert ends[-1] == "completed"

                by_status = await prom.until(
                    "sum by (status) (antwort_responses_total)",
                    lambda r: sum(values(r, "status").values()) >= 6,
                )
                assert values(by_status, "status") == {"completed": 5, "failed": 1}
                tools = await prom.query('antwort_tool_calls_total{tool="get_weather"}')
                assert [(t["metric"]["executor"], t["metric"]["outcome"], t["value"][1]) for t in tools] == [
                    ("weather", "success", "2")
                ]
                errors = await prom.query("antwort_backend_errors_total")
                assert values(errors, "code") == {"rate_limited": 1}
                assert values(await prom.query("antwort_executor_up"), "executor") == {service.target: 1}
                # GenAI conventions: token usage per model call by type, time to first token of the
                # streamed answers, and the server-side duration of every response.
                tokens = await prom.query(
                    "sum by (gen_ai_token_type) (gen_ai_client_token_usage_sum{gen_ai_request_model='test-model'})"
                )
                assert values(tokens, "gen_ai_token_type")["output"] >= 18
                ttft = await prom.query("sum(gen_ai_server_time_to_first_token_seconds_count)")
                assert float(ttft[0]["value"][1]) == 4, "the four streamed responses that produced output"
                turns = await prom.query("histogram_quantile(1, sum by (le) (antwort_response_turns_bucket))")
                assert float(turns[0]["value"][1]) == 2, "the weather conversation took two turns"
                stores = await prom.query("sum by (operation) (antwort_store_operation_duration_seconds_count)")
                assert values(stores, "operation")["save"] >= 10
                assert values(await prom.query("antwort_open_streams"), "") == {"": 0}

                async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as r:
                    exposition = await r.text()
                check = promtool_check_metrics(exposition)
                assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr
    finally:
        await remote.close()
        await service.stop(0)


async def test_a_completed_model_call_is_recorded_the_same_streamed_or_not(tmp_path: Path) -> None:
    # The real provider over HTTP. An answer without a single delta hands the engine its TurnEnd
    # first, and the engine (waiting for it: the backend answers late) stops reading there: the
    # model call's stream is closed, not run out.
    answers = [Reply(text="one two three four", first_delay=0.3), Reply(text="", first_delay=0.3)]
    backend = FakeOpenAI(*[answer for answer in answers for _ in ("streamed", "not streamed")])
    metrics_port = free_port()
    traces = {
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_SERVICE_NAME": "gateway",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    async with otlp_receiver() as (receiver, endpoint), backend:
        gateway = await start_process(
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            "memory",
            "--backend-url",
            backend.url,
            "--model",
            "m1",
            "--metrics-listen",
            f"127.0.0.1:{metrics_port}",
            env={**traces, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint},
        )
        try:
            async with (
                grpc.aio.insecure_channel(gateway.target) as channel,
                prometheus(tmp_path, [f"127.0.0.1:{metrics_port}"]) as prom,
            ):
                stub = pb.ResponsesServiceStub(channel)
                for _ in answers:
                    for stream in (True, False):
                        request = pb.CreateResponseRequest(input_text="count to four", stream=stream)
                        events = await collect(stub.CreateResponse(request, timeout=60))
                        assert events[-1].WhichOneof("event") == "completed"
                calls = await prom.until(
                    "sum by (error_type) (gen_ai_client_operation_duration_seconds_count)",
                    lambda r: sum(values(r, "error_type").values()) >= 4,
                )
                assert values(calls, "error_type") == {"": 4}, "every call completed: none has an error type"
                assert await prom.query("antwort_backend_errors_total") == []
                spans = await receiver.wait_for(lambda spans: sum(s.name == "chat m1" for s in spans) >= 4)
        finally:
            await stop_process(gateway.proc, graceful=True)
    chats = [(s.status, s.status_message, s.attributes.get("error.type")) for s in spans if s.name == "chat m1"]
    assert chats == [(0, "", None)] * 4, "no model-call span ends in an error"


async def refused(code: grpc.StatusCode, call: Any) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    assert raised.value.code() == code, raised.value.details()


async def test_prometheus_sees_every_rpc_by_status_the_refused_requests_and_the_process(tmp_path: Path) -> None:
    gate = asyncio.Event()

    def script(request: TurnRequest) -> Turn:
        text = request.items[0].message.content[0].input_text.text
        return Turn([Text("a long answer")], hold=gate if text == "hold" else None, hold_at=1)

    provider = ScriptedProvider([script], repeat=True)
    credentials = api_keys(tmp_path)
    alice = credentials.of("alice")
    async with running_gateway(
        provider=provider, metrics_listen="127.0.0.1:0", max_concurrent_responses=1, **credentials.settings
    ) as gw:
        port = gw.gateway.metrics_port
        assert port
        stub, ok, bad = gw.stub, user("hello"), pb.CreateResponseRequest(input_text="hi", temperature=3.5)
        async with prometheus(tmp_path, [f"127.0.0.1:{port}"]) as prom:
            await collect(stub.CreateResponse(ok, metadata=alice))
            await refused(grpc.StatusCode.UNAUTHENTICATED, collect(stub.CreateResponse(ok)))
            wrong_key = (("authorization", "Bearer not-a-key"),)
            await refused(
                grpc.StatusCode.UNAUTHENTICATED, stub.GetResponse(pb.GetResponseRequest(), metadata=wrong_key)
            )
            await refused(grpc.StatusCode.INVALID_ARGUMENT, collect(stub.CreateResponse(bad, metadata=alice)))
            # Bytes that are no CreateResponseRequest (a string field of bad UTF-8).
            raw = gw.channel.unary_stream("/antwort.v1.ResponsesService/CreateResponse")
            await refused(grpc.StatusCode.INVALID_ARGUMENT, collect(raw(b"\x0a\x01\xff", metadata=alice)))
            session = stub.Converse(iter([pb.ConverseRequest(create=bad)]), metadata=alice)
            await refused(grpc.StatusCode.INVALID_ARGUMENT, collect(session))
            # Alice's one response at a time is running: her next is over the limit.
            held = stub.CreateResponse(pb.CreateResponseRequest(input_text="hold", stream=True), metadata=alice)
            await held.read()
            await provider.holding.wait()
            await refused(grpc.StatusCode.RESOURCE_EXHAUSTED, collect(stub.CreateResponse(ok, metadata=alice)))
            gate.set()
            while (message := await held.read()) is not grpc.aio.EOF:
                last = message.event.WhichOneof("event")
            assert last == "completed"
            await refused(
                grpc.StatusCode.NOT_FOUND, stub.GetResponse(pb.GetResponseRequest(response_id="resp_x"), metadata=alice)
            )
            # Open without credentials; reflection is not.
            await health_pb2_grpc.HealthStub(gw.channel).Check(health_pb2.HealthCheckRequest())
            reflection = reflection_pb2_grpc.ServerReflectionStub(gw.channel)
            listing = reflection.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=alice
            )
            assert [r async for r in listing]

            handled = await prom.until(
                "sum by (grpc_service, grpc_method, grpc_type, grpc_code) (grpc_server_handled_total)",
                lambda r: sum(float(s["value"][1]) for s in r) >= 11,
            )
            by_call = {
                (s["metric"]["grpc_method"], s["metric"]["grpc_type"], s["metric"]["grpc_code"]): float(s["value"][1])
                for s in handled
            }
            assert by_call == {
                ("CreateResponse", "server_stream", "OK"): 2,
                ("CreateResponse", "server_stream", "Unauthenticated"): 1,
                ("CreateResponse", "server_stream", "InvalidArgument"): 2,
                ("CreateResponse", "server_stream", "ResourceExhausted"): 1,
                ("GetResponse", "unary", "Unauthenticated"): 1,
                ("GetResponse", "unary", "NotFound"): 1,
                ("Converse", "bidi_stream", "InvalidArgument"): 1,
                ("Check", "unary", "OK"): 1,
                ("ServerReflectionInfo", "bidi_stream", "OK"): 1,
            }
            started = await prom.query("sum(grpc_server_started_total)")
            assert float(started[0]["value"][1]) == 11
            timed = await prom.query("sum by (grpc_method) (grpc_server_handling_seconds_count)")
            assert values(timed, "grpc_method") == {
                "CreateResponse": 6,
                "GetResponse": 2,
                "Converse": 1,
                "Check": 1,
                "ServerReflectionInfo": 1,
            }

            refusals = await prom.query("antwort_requests_refused_total")
            assert {
                (s["metric"]["method"], s["metric"]["code"], s["metric"]["reason"]): float(s["value"][1])
                for s in refusals
            } == {
                ("CreateResponse", "UNAUTHENTICATED", "unauthenticated"): 1,
                ("GetResponse", "UNAUTHENTICATED", "unauthenticated"): 1,
                ("CreateResponse", "INVALID_ARGUMENT", "invalid_request"): 2,
                ("Converse", "INVALID_ARGUMENT", "invalid_request"): 1,
                ("CreateResponse", "RESOURCE_EXHAUSTED", "too_many_responses"): 1,
            }

            for process in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"):
                sample = await prom.query(process)
                assert len(sample) == 1 and float(sample[0]["value"][1]) > 0, process

            async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as r:
                exposition = await r.text()
            check = promtool_check_metrics(exposition)
            assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr


def model_calls(metrics: Metrics) -> dict[str, float]:
    """gen_ai_client_operation_duration_seconds' count by error_type."""
    return {
        sample.labels["error_type"]: sample.value
        for family in metrics.registry.collect()
        if family.name == "gen_ai_client_operation_duration_seconds"
        for sample in family.samples
        if sample.name.endswith("_count")
    }


async def test_a_stream_closed_right_after_its_turn_end_is_a_completed_model_call() -> None:
    metrics = Metrics()
    answer = Turn([Text("three little words")], usage=pb.Usage(input_tokens=3, output_tokens=3))
    observed = ObservedProvider(ScriptedProvider([answer, answer]), metrics, None)
    turn = TurnRequest(model="m", instructions="", items=[], tools=[])
    stream = observed.stream(turn)
    async for event in stream:
        if isinstance(event, TurnEnd):
            break  # as the engine does: the turn is over, nothing more is read
    await stream.aclose()
    await observed.complete(turn)
    assert model_calls(metrics) == {"": 2}


def handled(metrics: Metrics) -> dict[tuple[str, str, str], float]:
    """grpc_server_handled_total by (method, type, code), as the registry exposes it."""
    return {
        (s.labels["grpc_method"], s.labels["grpc_type"], s.labels["grpc_code"]): s.value
        for family in metrics.registry.collect()
        if family.name == "grpc_server_handled"
        for s in family.samples
        if s.name.endswith("_total")
    }


def sample_sum(metrics: Metrics, name: str) -> float:
    return sum(s.value for family in metrics.registry.collect() for s in family.samples if s.name == name)


async def test_without_authentication_every_rpc_is_counted_by_status_those_that_fail_early_too() -> None:
    gate = asyncio.Event()

    def script(request: TurnRequest) -> Turn:
        text = request.items[0].message.content[0].input_text.text
        return Turn([Text("a long answer")], hold=gate if text == "hold" else None, hold_at=1)

    async with running_gateway(provider=ScriptedProvider([script], repeat=True), metrics_listen="127.0.0.1:0") as gw:
        observability = gw.gateway.core.observability
        assert observability is not None and observability.metrics is not None
        metrics = observability.metrics
        await collect(gw.stub.CreateResponse(user("hello")))
        raw = gw.channel.unary_stream("/antwort.v1.ResponsesService/CreateResponse")
        await refused(grpc.StatusCode.INVALID_ARGUMENT, collect(raw(b"\x0a\x01\xff")))
        await refused(grpc.StatusCode.NOT_FOUND, gw.stub.GetResponse(pb.GetResponseRequest(response_id="resp_x")))
        # A client that goes away in the middle of a stream.
        held = gw.stub.CreateResponse(pb.CreateResponseRequest(input_text="hold", stream=True))
        await held.read()
        held.cancel()
        await health_pb2_grpc.HealthStub(gw.channel).Check(health_pb2.HealthCheckRequest())
        reflection = reflection_pb2_grpc.ServerReflectionStub(gw.channel)
        assert [r async for r in reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest()]))]
        expected = {
            ("CreateResponse", "server_stream", "OK"): 1,
            ("CreateResponse", "server_stream", "InvalidArgument"): 1,
            ("CreateResponse", "server_stream", "Canceled"): 1,
            ("GetResponse", "unary", "NotFound"): 1,
            ("Check", "unary", "OK"): 1,
            ("ServerReflectionInfo", "bidi_stream", "OK"): 1,
        }
        # The server's side of a cancelled call ends after the client has gone.
        for _ in range(200):
            if handled(metrics) == expected:
                break
            await asyncio.sleep(0.05)
        gate.set()
        assert handled(metrics) == expected
        assert sample_sum(metrics, "grpc_server_started_total") == 6
        assert sample_sum(metrics, "grpc_server_handling_seconds_count") == 6
