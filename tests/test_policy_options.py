"""The request's policy options through a real gateway: tool timeouts (executor services on
loopback ports, the sandbox as a process), the tool failure mode, execution limits, the context
window (truncation, and the backend's "context length exceeded" over real HTTP), run metrics."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from antwort_grpc import pb
from antwort_grpc.executors.base import ProgressSink
from antwort_grpc.providers.base import TurnRequest
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text, Turn
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply
from antwort_grpc.tool_services.sdk import ExecutorService, function_tool, text_result
from tests.executors.remote_services import OBJECT, gateway_with_services
from tests.fakes import MockExecutor, echo, fails
from tests.harness import GatewayClient, final, output_kinds, running_gateway, user
from tests.harness import function_tool as request_tool
from tests.test_validation_and_rpcs import violations_of

S = pb.ResponseStatus


def seconds(value: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(int(value * 1e9))
    return d


def outputs(request: TurnRequest) -> list[pb.FunctionCallOutput]:
    return [i.function_call_output for i in request.items if i.WhichOneof("kind") == "function_call_output"]


def with_tools(*names: str) -> pb.CreateResponseRequest:
    request = user("go")
    request.tools.extend(request_tool(n, q="string") for n in names)
    return request


# -- tool timeouts -----------------------------------------------------------------------------------


class Sleeper(ExecutorService):
    """`slow` and `advertised_slow` (default timeout 0.3 s) never finish; each cancellation the
    service sees is counted."""

    name = "sleeper"

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    async def list_tools(self) -> list[pb.ExecutorTool]:
        return [
            function_tool("slow", "Never ends", OBJECT),
            function_tool("advertised_slow", "Never ends either", OBJECT, timeout=0.3),
        ]

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: ProgressSink) -> pb.FunctionCallOutput:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return text_result("never")


def calls_then_reports(name: str) -> ScriptedProvider:
    return ScriptedProvider([[Call.of(name, call_id="call_1")], lambda t: [Text(outputs(t)[0].output)]])


@pytest.mark.parametrize(
    ("tool", "edit", "expected"),
    [
        ("slow", lambda r: r.tool_timeout.CopyFrom(seconds(0.3)), "0.3"),
        ("advertised_slow", lambda r: None, "0.3"),
        ("advertised_slow", lambda r: r.tool_timeout.CopyFrom(seconds(0.2)), "0.2"),
        (
            "slow",
            lambda r: (r.tool_timeout.CopyFrom(seconds(60)), r.tool_timeouts["slow"].CopyFrom(seconds(0.2))),
            "0.2",
        ),
    ],
    ids=["request timeout", "executor default", "request beats executor", "per-tool override beats request"],
)
async def test_tool_timeout_cancels_the_call_and_feeds_back_an_error(tool: str, edit: object, expected: str) -> None:
    sleeper = Sleeper()
    provider = calls_then_reports(tool)
    async with gateway_with_services(provider, sleeper) as setup:
        request = with_tools(tool)
        edit(request)  # type: ignore[operator]
        events = await setup.gateway.stream(request)
        await asyncio.wait_for(sleeper.cancelled.wait(), 10)  # the service saw its RPC cancelled
    response = final(events)
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    fed_back = outputs(provider.requests[1])[0]
    assert fed_back.is_error and fed_back.output == f"tool {tool!r} timed out after {expected} s"
    [failed] = [e.tool_execution_failed for e in events if e.WhichOneof("event") == "tool_execution_failed"]
    assert failed.timed_out and failed.call_id == "call_1"
    assert response.metrics.tool_timeouts == 1 and response.metrics.tools[0].timeouts == 1


async def test_sandbox_code_that_runs_past_the_tool_timeout_is_killed(tmp_path_factory: pytest.TempPathFactory) -> None:
    from antwort_grpc.executors.remote import RemoteExecutor
    from tests.executors.test_sandbox import _start, leftover_processes

    code = "import time\ntime.sleep(1000)"
    provider = ScriptedProvider(
        [[Call.of("run_python", {"code": code}, call_id="call_1")], lambda t: [Text(outputs(t)[0].output)]]
    )
    for box in _start(tmp_path_factory.mktemp("sandbox"), "timeout", timeout_seconds="120"):
        async with RemoteExecutor(box.target) as remote, running_gateway(provider=provider, executors=[remote]) as gw:
            request = user("run it")
            request.tools.append(pb.Tool(code_interpreter=pb.CodeInterpreterTool()))
            request.tool_timeout.CopyFrom(seconds(1))
            request.stream = True
            running: list[int] = []
            events = []
            async for message in gw.stub.CreateResponse(request):
                events.append(message.event)
                if message.event.WhichOneof("event") == "tool_execution_progress" and not running:
                    running = leftover_processes(box)
                    assert running, "the code is running"
            # Whatever of the code is still there ends: awaited on pidfds, not polled.
            pidfds = [fd for fd in map(os_pidfd, leftover_processes(box)) if fd is not None]
            await asyncio.wait_for(asyncio.gather(*(exited(fd) for fd in pidfds)), 15)
            assert leftover_processes(box) == []
        response = final(events)
        assert outputs(provider.requests[1])[0].output == "tool 'run_python' timed out after 1 s"
        assert response.status == S.RESPONSE_STATUS_COMPLETED


def os_pidfd(pid: int) -> int | None:
    """A pidfd of the process, or None when it is gone already."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None


async def exited(fd: int) -> None:
    """Until the process of a pidfd has exited (the fd becomes readable)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(fd, lambda: done.done() or done.set_result(None))
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)


# -- tool failure mode --------------------------------------------------------------------------------


def ok_then_bad_then_answer() -> ScriptedProvider:
    return ScriptedProvider(
        [[Call.of("good", call_id="call_good")], [Call.of("bad", call_id="call_bad")], [Text("Done anyway.")]]
    )


async def test_failure_mode_fail_ends_the_response_at_the_first_failed_call_keeping_outputs() -> None:
    provider = ok_then_bad_then_answer()
    async with running_gateway(provider=provider, executors=[MockExecutor({"good": echo, "bad": fails})]) as gw:
        request = with_tools("good", "bad")
        request.tool_failure_mode = pb.ToolFailureMode.TOOL_FAILURE_MODE_FAIL
        response = final(await gw.stream(request))
    assert response.status == S.RESPONSE_STATUS_FAILED and response.error.code == "tool_failed"
    assert "'bad' (call_bad)" in response.error.message and "bad exploded" in response.error.message
    assert output_kinds(response) == ["function_call", "function_call_output"] * 2, "outputs so far kept"
    assert response.output[3].function_call_output.is_error
    assert len(provider.requests) == 2, "no turn after the failure"


async def test_failure_mode_continue_is_the_default_and_feeds_the_error_back() -> None:
    provider = ok_then_bad_then_answer()
    async with running_gateway(provider=provider, executors=[MockExecutor({"good": echo, "bad": fails})]) as gw:
        response = await gw.create(with_tools("good", "bad"))
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    assert outputs(provider.requests[2])[-1].is_error


# -- execution limits -------------------------------------------------------------------------------


def calling(*turns: list[Call]) -> ScriptedProvider:
    return ScriptedProvider([*turns, [Text("Done.")]])


async def test_request_turn_limit_ends_incomplete() -> None:
    provider = calling([Call.of("a")], [Call.of("a")])
    async with running_gateway(provider=provider, executors=[MockExecutor({"a": echo})]) as gw:
        request = with_tools("a")
        request.limits.max_turns = 1
        response = await gw.create(request)
    assert response.status == S.RESPONSE_STATUS_INCOMPLETE and response.incomplete_details.reason == "max_turns"
    assert len(provider.requests) == 1


async def test_tool_call_limit_ends_incomplete_before_calls_beyond_it_run() -> None:
    provider = calling([Call.of("a", call_id="c1")], [Call.of("a", call_id="c2"), Call.of("a", call_id="c3")])
    executor = MockExecutor({"a": echo})
    async with running_gateway(provider=provider, executors=[executor]) as gw:
        request = with_tools("a")
        request.limits.max_tool_calls = 2
        response = final(await gw.stream(request))
    assert response.status == S.RESPONSE_STATUS_INCOMPLETE
    assert response.incomplete_details.reason == "max_tool_calls"
    assert [c.call_id for c in executor.calls] == ["c1"], "the two calls that would pass the limit never ran"
    assert response.metrics.tool_calls == 1


async def test_wall_time_limit_ends_incomplete_with_what_was_done() -> None:
    never = asyncio.Event()
    provider = ScriptedProvider([Turn([Text("Thinking about it for a long time")], hold=never, hold_at=2)])
    async with running_gateway(provider=provider) as gw:
        request = user("hi")
        request.limits.max_duration.CopyFrom(seconds(0.3))
        response = final(await gw.stream(request))
    assert response.status == S.RESPONSE_STATUS_INCOMPLETE and response.incomplete_details.reason == "max_duration"
    assert response.output[0].status == pb.ItemStatus.ITEM_STATUS_INCOMPLETE, "the partial answer is kept"


async def test_output_token_limit_over_the_whole_response() -> None:
    # Every scripted turn reports 5 output tokens.
    provider = calling([Call.of("a")], [Call.of("a")], [Call.of("a")])
    async with running_gateway(provider=provider, executors=[MockExecutor({"a": echo})]) as gw:
        request = with_tools("a")
        request.limits.max_output_tokens = 8
        response = await gw.create(request)
    assert [r.max_output_tokens for r in provider.requests] == [8, 3], "each call gets what is left"
    assert response.status == S.RESPONSE_STATUS_INCOMPLETE
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 10


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda r: setattr(r.limits, "max_tool_calls", 6), "limits.max_tool_calls"),
        (lambda r: setattr(r.limits, "max_turns", 11), "limits.max_turns"),
        (lambda r: r.limits.max_duration.CopyFrom(seconds(-1)), "limits.max_duration"),
        (lambda r: r.tool_timeout.CopyFrom(seconds(301)), "tool_timeout"),
        (lambda r: r.tool_timeouts["a"].CopyFrom(seconds(0)), "tool_timeouts[a]"),
    ],
    ids=["above the server's tool call maximum", "above max turns", "negative duration", "absurd timeout", "zero"],
)
async def test_limits_beyond_the_server_are_invalid_argument(edit: object, field: str) -> None:
    provider = ScriptedProvider([[Text("never")]])
    async with running_gateway(provider=provider, max_tool_calls=5) as gw:
        request = user("hi")
        edit(request)  # type: ignore[operator]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await gw.create(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert list(violations_of(info.value)) == [field]
    assert provider.requests == []


# -- context window ---------------------------------------------------------------------------------


def conversation(turns: int) -> pb.CreateResponseRequest:
    request = pb.CreateResponseRequest()
    system = pb.Item(message=pb.Message(role=pb.Role.ROLE_SYSTEM, content=[part("You are terse.")]))
    request.input_items.items.append(system)
    for n in range(turns):
        request.input_items.items.append(pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[part(f"q{n}")])))
    return request


def part(text: str) -> pb.ContentPart:
    return pb.ContentPart(input_text=pb.InputText(text=text))


def texts(request: TurnRequest) -> list[str]:
    return [i.message.content[0].input_text.text for i in request.items if i.WhichOneof("kind") == "message"]


async def test_truncation_auto_sends_a_window_and_records_what_was_left_out() -> None:
    provider = ScriptedProvider([[Text("a")], [Text("b")]])
    async with running_gateway(provider=provider, context_max_items=3) as gw:
        request = conversation(6)
        request.truncation = pb.Truncation.TRUNCATION_AUTO
        response = await gw.create(request)
        whole = await gw.create(conversation(6))  # DISABLED by default: everything is sent
    assert texts(provider.requests[0]) == ["You are terse.", "q4", "q5"]
    assert response.omitted_items == 4 and response.truncation == pb.Truncation.TRUNCATION_AUTO
    assert len(provider.requests[1].items) == 7 and whole.omitted_items == 0


@asynccontextmanager
async def on_backend(fake: FakeOpenAI, **settings: object) -> AsyncIterator[GatewayClient]:
    provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model="fake-model", max_retries=0))
    try:
        async with running_gateway(provider=provider, model="fake-model", **settings) as gw:
            yield gw
    finally:
        await provider.aclose()


TOO_LONG = Reply(
    status=400,
    error_message="This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.",
    error_code="context_length_exceeded",
)


@pytest.mark.parametrize("stream", [True, False])
async def test_context_length_exceeded_with_auto_retries_once_with_half_the_window(stream: bool) -> None:
    async with FakeOpenAI() as fake:
        fake.add(TOO_LONG, Reply(text="Short enough now."))
        async with on_backend(fake) as gw:
            request = conversation(8)
            request.truncation = pb.Truncation.TRUNCATION_AUTO
            response = final(await gw.stream(request)) if stream else await gw.create(request)
        sent = [len(body["messages"]) for body in fake.chat_requests]
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    assert sent == [9, 4], "all nine items, then half: the system message and the newest three"
    assert response.omitted_items == 5


async def test_context_length_exceeded_with_truncation_disabled_fails_the_response() -> None:
    async with FakeOpenAI() as fake:
        fake.add(TOO_LONG)
        async with on_backend(fake) as gw:
            response = final(await gw.stream(conversation(8)))
        assert len(fake.chat_requests) == 1
    assert response.status == S.RESPONSE_STATUS_FAILED
    assert response.error.code == "context_length_exceeded"
    assert "maximum context length" in response.error.message


# -- run metrics ------------------------------------------------------------------------------------


async def test_run_metrics_are_returned_and_stored_with_the_response() -> None:
    provider = calling([Call.of("a", call_id="c1"), Call.of("b", call_id="c2")], [Call.of("a", call_id="c3")])
    async with running_gateway(provider=provider, executors=[MockExecutor({"a": echo, "b": fails})]) as gw:
        response = final(await gw.stream(with_tools("a", "b")))
        stored = (await gw.stub.GetResponse(pb.GetResponseRequest(response_id=response.id))).response
    m = response.metrics
    assert (m.turns, m.model_calls, m.tool_calls, m.tool_errors, m.tool_timeouts) == (3, 3, 3, 1, 0)
    assert [(t.name, t.calls, t.errors) for t in m.tools] == [("a", 2, 0), ("b", 1, 1)]
    assert [t.turn for t in m.turn_metrics] == [1, 2, 3]
    assert [t.usage.output_tokens for t in m.turn_metrics] == [5, 5, 5]
    assert m.duration.ToNanoseconds() >= m.model_time.ToNanoseconds() > 0
    assert m.hook_calls == 0 and m.hook_time.ToNanoseconds() == 0
    assert stored.metrics == m
    assert json.loads(response.output[2].function_call_output.output)["tool"] == "a"
