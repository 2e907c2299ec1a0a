"""Interactive runs through a real gateway: steer, follow up, approve, pause and resume a running
response, over the bidirectional Converse stream and the unary ControlResponse. Scripted models
hold their streams until the test releases them: nothing sleeps to synchronise."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import pytest

from antwort_grpc import pb
from antwort_grpc.executors.base import FunctionExecutor, ProgressSink
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text, Turn
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply, ScriptedToolCall
from tests.harness import (
    GatewayClient,
    assert_valid_stream,
    function_tool,
    kind,
    kinds,
    output_kinds,
    output_text,
    running_gateway,
    user,
)

S = pb.ResponseStatus
TERMINAL = {"completed", "incomplete", "failed", "cancelled", "requires_action"}


class GatedTool:
    """A server-side executor whose `slow` tool runs until the test releases it."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.calls: list[str] = []

    @property
    def kind(self) -> int:
        return pb.ToolKind.TOOL_KIND_CUSTOM

    async def can_execute(self, tool: pb.Tool) -> bool:
        return tool.WhichOneof("kind") == "function" and tool.function.name in ("slow", "risky", "fast")

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: ProgressSink) -> pb.FunctionCallOutput:
        self.calls.append(call.name)
        if call.name == "slow":
            self.started.set()
            await self.release.wait()
        return pb.FunctionCallOutput(output=f"{call.name} done")


def steer(text: str) -> pb.Control:
    return pb.Control(steer=pb.SteerControl(items=[_message(text)]))


def follow_up(text: str) -> pb.Control:
    return pb.Control(follow_up=pb.FollowUpControl(items=[_message(text)]))


def approval(call_id: str, approve: bool, reason: str = "") -> pb.Control:
    return pb.Control(approval=pb.ApprovalResponse(call_id=call_id, approve=approve, reason=reason))


def _message(text: str) -> pb.Item:
    part = pb.ContentPart(input_text=pb.InputText(text=text))
    return pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[part]))


def needs_approval(tool: pb.Tool) -> pb.Tool:
    tool.require_approval.mode = pb.ApprovalMode.APPROVAL_MODE_ALWAYS
    return tool


class Session:
    """One Converse stream, read event by event."""

    def __init__(self, gw: GatewayClient, timeout: float | None = 30) -> None:
        self.call = gw.stub.Converse(timeout=timeout)
        self.events: list[pb.StreamEvent] = []
        self.rejected: list[pb.ControlRejected] = []

    async def start(self, request: pb.CreateResponseRequest) -> None:
        await self.call.write(pb.ConverseRequest(create=request))

    async def send(self, control: pb.Control) -> None:
        await self.call.write(pb.ConverseRequest(control=control))

    async def accepted(self, gw: GatewayClient, control: pb.Control) -> None:
        """The same control by response id: the unary call returns once the run has taken it, so
        a test can release the model knowing the control is in."""
        response_id = next(e.created.response.id for e in reversed(self.events) if kind(e) == "created")
        await gw.stub.ControlResponse(pb.ControlResponseRequest(response_id=response_id, control=control))

    async def until(self, name: str) -> pb.StreamEvent:
        """Read up to and including the next event called `name`."""
        while True:
            message = await self.call.read()
            assert message is not grpc.aio.EOF, f"stream ended before {name}"
            if message.WhichOneof("message") == "rejected":
                self.rejected.append(message.rejected)
                if name == "rejected":
                    return pb.StreamEvent()
                continue
            self.events.append(message.event)
            if kind(message.event) == name or (name == "terminal" and kind(message.event) in TERMINAL):
                return message.event

    def response_events(self) -> list[pb.StreamEvent]:
        """The events of the latest response (from its created event)."""
        starts = [n for n, e in enumerate(self.events) if kind(e) == "created"]
        return self.events[starts[-1] :]


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    # Strict: a history in which a call has no tool message is rejected, as OpenAI does.
    async with FakeOpenAI(strict=True) as backend:
        yield backend


@pytest.fixture
async def backend(fake: FakeOpenAI) -> AsyncIterator[OpenAICompatProvider]:
    provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model="fake-model"))
    yield provider
    await provider.aclose()


def messages_of(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["role"], m.get("content") or "") for m in body["messages"]]


# -- steering ------------------------------------------------------------------------------------


async def test_steer_while_the_model_streams_cuts_the_stream_and_the_next_request_holds_the_message(
    fake: FakeOpenAI, backend: OpenAICompatProvider
) -> None:
    fake.add(Reply(text="I will use the US endpoint for this", hold_at=4), Reply(text="Using the EU endpoint."))
    async with running_gateway(provider=backend) as gw:
        session = Session(gw)
        await session.start(user("deploy it"))
        await session.until("output_text_delta")
        await fake.wait_held()
        await session.send(steer("stop, use the EU endpoint instead"))
        await session.until("input_injected")
        fake.release()
        terminal = await session.until("terminal")
    events = session.response_events()
    assert_valid_stream(events)
    response = terminal.completed.response
    assert output_kinds(response) == ["message", "message", "message"]
    cut, injected, answer = response.output
    assert cut.status == pb.ItemStatus.ITEM_STATUS_INCOMPLETE
    assert injected.message.role == pb.Role.ROLE_USER
    assert output_text(pb.Response(output=[answer])) == "Using the EU endpoint."
    decided = [e.turn_decided.decision for e in events if kind(e) == "turn_decided"]
    assert decided == [pb.TurnDecision.TURN_DECISION_INTERRUPTED, pb.TurnDecision.TURN_DECISION_RESPOND]
    second = fake.chat_requests[1]
    assert messages_of(second)[-1] == ("user", "stop, use the EU endpoint instead")


async def test_steer_cuts_a_streaming_tool_call_and_gives_it_an_output_before_the_message(
    fake: FakeOpenAI, backend: OpenAICompatProvider
) -> None:
    call = ScriptedToolCall(id="call_x", name="slow", arguments='{"target": "us-east-1"}')
    fake.add(Reply(tool_calls=[call], hold_at=2), Reply(text="Done in the EU."))
    tool = GatedTool()
    async with running_gateway(provider=backend, executors=[FunctionExecutor(), tool]) as gw:
        session = Session(gw)
        request = user("deploy it")
        request.tools.append(function_tool("slow", target="string"))
        await session.start(request)
        # The call is in the stream (its item added) and the backend holds the rest of it.
        await session.until("output_item_added")
        await fake.wait_held()
        await session.send(steer("use eu-west-1"))
        injected = await session.until("input_injected")
        fake.release()
        terminal = await session.until("terminal")
    assert_valid_stream(session.response_events())
    assert list(injected.input_injected.superseded_call_ids) == ["call_x"]
    assert not tool.calls, "a call cut by a steering message never runs"
    response = terminal.completed.response
    assert output_kinds(response) == ["function_call", "function_call_output", "message", "message"]
    assert response.output[1].function_call_output.is_error
    assert "superseded" in response.output[1].function_call_output.output
    # The strict backend accepted the history: every call has its output before the message.
    roles = [m["role"] for m in fake.chat_requests[1]["messages"]]
    assert roles[-3:] == ["assistant", "tool", "user"]


async def test_steer_that_cuts_a_call_mid_arguments_keeps_them_and_sends_the_backend_json(
    fake: FakeOpenAI, backend: OpenAICompatProvider
) -> None:
    # Four fragments of '{"city": "Paris"}': the backend holds after the first, '{"cit'.
    call = ScriptedToolCall(id="call_x", name="get_weather", arguments='{"city": "Paris"}', fragments=4)
    fake.add(Reply(tool_calls=[call], hold_at=3), Reply(text="Rome, then."))
    async with running_gateway(provider=backend) as gw:
        session = Session(gw)
        request = user("weather?")
        request.tools.append(function_tool("get_weather", city="string"))
        await session.start(request)
        await session.until("function_call_arguments_delta")
        await fake.wait_held()
        await session.send(steer("Rome instead"))
        await session.until("input_injected")
        fake.release()
        terminal = await session.until("terminal")
    response = terminal.completed.response
    assert response.status == S.RESPONSE_STATUS_COMPLETED, response.error
    assert response.output[0].function_call.arguments == '{"cit', "the stored call is what the model wrote"
    sent = fake.chat_requests[1]["messages"]
    assistant = next(m for m in sent if m.get("tool_calls"))
    assert assistant["tool_calls"][0]["function"]["arguments"] == "{}"
    assert messages_of(fake.chat_requests[1])[-1] == ("user", "Rome instead")


async def test_steer_during_tool_execution_lets_running_calls_finish_then_injects() -> None:
    tool = GatedTool()
    provider = ScriptedProvider([[Call.of("slow", {}, call_id="c1")], [Text("Adjusted.")]])
    async with running_gateway(provider=provider, executors=[FunctionExecutor(), tool]) as gw:
        session = Session(gw)
        request = user("go")
        request.tools.append(function_tool("slow"))
        await session.start(request)
        await session.until("tool_execution_in_progress")
        await tool.started.wait()
        await session.accepted(gw, steer("also check the logs"))
        tool.release.set()
        terminal = await session.until("terminal")
    events = session.response_events()
    assert_valid_stream(events)
    response = terminal.completed.response
    assert output_kinds(response) == ["function_call", "function_call_output", "message", "message"]
    assert response.output[1].function_call_output.output == "slow done"
    assert not response.output[1].function_call_output.is_error
    assert response.output[2].message.content[0].input_text.text == "also check the logs"
    second = provider.requests[1].items
    assert second[-1].message.content[0].input_text.text == "also check the logs"


async def test_steer_at_a_turn_boundary_is_added_before_the_next_model_call() -> None:
    hold = asyncio.Event()
    provider = ScriptedProvider(
        [Turn([Call.of("fast", {}, call_id="c1")]), Turn([Text("a long answer")], hold=hold), [Text("Brief.")]]
    )
    async with running_gateway(provider=provider, executors=[FunctionExecutor(), GatedTool()]) as gw:
        session = Session(gw)
        request = user("go")
        request.tools.append(function_tool("fast"))
        await session.start(request)
        await session.until("turn_completed")
        await provider.holding.wait()
        # The second turn waits for its first delta: the message cuts it and joins before the next.
        await session.send(steer("and be brief"))
        await session.until("input_injected")
        hold.set()
        terminal = await session.until("terminal")
    assert_valid_stream(session.response_events())
    assert provider.requests[-1].items[-1].message.content[0].input_text.text == "and be brief"
    assert output_text(terminal.completed.response).endswith("Brief.")


# -- follow-up -------------------------------------------------------------------------------------


async def test_follow_up_queued_during_the_run_starts_a_new_round_after_the_answer() -> None:
    hold = asyncio.Event()
    provider = ScriptedProvider([Turn([Text("Paris is sunny.")], hold=hold, hold_at=1), [Text("Berlin is rainy.")]])
    async with running_gateway(provider=provider) as gw:
        session = Session(gw)
        await session.start(user("weather in Paris?"))
        await session.until("created")
        await provider.holding.wait()
        await session.accepted(gw, follow_up("and Berlin?"))
        hold.set()
        terminal = await session.until("terminal")
    events = session.response_events()
    assert_valid_stream(events)
    started = [(e.turn_started.turn, e.turn_started.round) for e in events if kind(e) == "turn_started"]
    assert started == [(1, 0), (2, 1)]
    injected = [e.input_injected for e in events if kind(e) == "input_injected"]
    assert [i.kind for i in injected] == [pb.InputKind.INPUT_KIND_FOLLOW_UP]
    response = terminal.completed.response
    assert output_kinds(response) == ["message", "message", "message"]
    assert "Berlin is rainy." in output_text(response)


async def test_follow_ups_count_against_the_turn_limit() -> None:
    hold = asyncio.Event()
    provider = ScriptedProvider([Turn([Text("one")], hold=hold), [Text("two")]])
    async with running_gateway(provider=provider, max_turns=1) as gw:
        session = Session(gw)
        await session.start(user("q"))
        await session.until("created")
        await provider.holding.wait()
        await session.accepted(gw, follow_up("more"))
        hold.set()
        terminal = await session.until("terminal")
    assert terminal.incomplete.response.incomplete_details.reason == "max_turns"


# -- approvals -------------------------------------------------------------------------------------


def _approval_request(tools: Sequence[pb.Tool]) -> pb.CreateResponseRequest:
    request = user("clean up")
    request.tools.extend(tools)
    return request


async def test_approved_call_runs_and_denied_call_gets_an_error_output_over_converse() -> None:
    tool = GatedTool()
    tool.release.set()
    provider = ScriptedProvider(
        [[Call.of("risky", {"path": "/tmp"}, call_id="a"), Call.of("slow", {}, call_id="b")], [Text("Done.")]]
    )
    tools = [needs_approval(function_tool("risky", path="string")), needs_approval(function_tool("slow"))]
    async with running_gateway(provider=provider, executors=[FunctionExecutor(), tool]) as gw:
        session = Session(gw)
        await session.start(_approval_request(tools))
        asked = await session.until("approval_requested")
        assert [r.call_id for r in asked.approval_requested.requests] == ["a", "b"]
        assert asked.approval_requested.requests[0].arguments == '{"path": "/tmp"}'
        await session.send(approval("a", True))
        await session.send(approval("b", False, "not now"))
        terminal = await session.until("terminal")
    assert_valid_stream(session.response_events())
    assert tool.calls == ["risky"]
    response = terminal.completed.response
    outputs = {
        i.function_call_output.call_id: i.function_call_output
        for i in response.output
        if i.HasField("function_call_output")
    }
    assert outputs["a"].output == "risky done" and not outputs["a"].is_error
    assert outputs["b"].is_error and "not now" in outputs["b"].output
    decisions = [i.approval_response for i in response.output if i.HasField("approval_response")]
    assert [(d.call_id, d.approve) for d in decisions] == [("a", True), ("b", False)]
    # The model saw the denial.
    assert any(
        i.function_call_output.is_error for i in provider.requests[1].items if i.HasField("function_call_output")
    )


async def test_approval_for_a_client_function_hands_the_call_out_once_approved() -> None:
    provider = ScriptedProvider([[Call.of("send_mail", {"to": "x"}, call_id="m")]])
    async with running_gateway(provider=provider) as gw:
        session = Session(gw)
        await session.start(_approval_request([needs_approval(function_tool("send_mail", to="string"))]))
        await session.until("approval_requested")
        await session.send(approval("m", True))
        terminal = await session.until("terminal")
    assert [c.call_id for c in terminal.requires_action.tool_calls] == ["m"]
    assert not terminal.requires_action.approval_requests


async def test_approval_timeout_denies_with_reason_timeout() -> None:
    tool = GatedTool()
    provider = ScriptedProvider([[Call.of("risky", {}, call_id="a")], [Text("Skipped.")]])
    async with running_gateway(provider=provider, executors=[FunctionExecutor(), tool], approval_timeout=0.2) as gw:
        session = Session(gw)
        await session.start(_approval_request([needs_approval(function_tool("risky"))]))
        terminal = await session.until("terminal")
    assert_valid_stream(session.response_events())
    response = terminal.completed.response
    decision = next(i.approval_response for i in response.output if i.HasField("approval_response"))
    assert not decision.approve and decision.reason == "timeout"
    assert not tool.calls


async def test_steer_while_approvals_wait_supersedes_the_waiting_calls() -> None:
    tool = GatedTool()
    provider = ScriptedProvider([[Call.of("risky", {}, call_id="a")], [Text("Fine.")]])
    async with running_gateway(provider=provider, executors=[FunctionExecutor(), tool]) as gw:
        session = Session(gw)
        await session.start(_approval_request([needs_approval(function_tool("risky"))]))
        await session.until("approval_requested")
        await session.send(steer("never mind, do nothing"))
        injected = await session.until("input_injected")
        terminal = await session.until("terminal")
    assert_valid_stream(session.response_events())
    assert list(injected.input_injected.superseded_call_ids) == ["a"]
    output = next(
        i.function_call_output for i in terminal.completed.response.output if i.HasField("function_call_output")
    )
    assert output.is_error and "superseded" in output.output
    assert not tool.calls


async def test_a_unary_response_awaiting_approval_ends_requires_action_and_is_continued() -> None:
    tool = GatedTool()
    tool.release.set()
    provider = ScriptedProvider([[Call.of("risky", {}, call_id="a")], [Text("Cleaned.")]])
    async with running_gateway(provider=provider, executors=[FunctionExecutor(), tool]) as gw:
        first = await gw.create(_approval_request([needs_approval(function_tool("risky"))]))
        assert first.status == S.RESPONSE_STATUS_REQUIRES_ACTION
        assert output_kinds(first) == ["function_call", "approval_request"]
        assert not tool.calls
        follow = pb.CreateResponseRequest(previous_response_id=first.id)
        follow.tools.append(needs_approval(function_tool("risky")))
        follow.input_items.items.add().approval_response.CopyFrom(pb.ApprovalResponse(call_id="a", approve=True))
        second = await gw.create(follow)
    assert second.status == S.RESPONSE_STATUS_COMPLETED
    assert tool.calls == ["risky"]
    assert output_kinds(second) == ["function_call_output", "message"]


async def test_the_requires_action_event_lists_the_approval_requests() -> None:
    provider = ScriptedProvider([[Call.of("risky", {"x": 1}, call_id="a")]])
    async with running_gateway(provider=provider, executors=[FunctionExecutor(), GatedTool()]) as gw:
        events = await gw.stream(_approval_request([needs_approval(function_tool("risky", x="integer"))]))
    terminal = events[-1].requires_action
    assert [(r.call_id, r.name, r.arguments) for r in terminal.approval_requests] == [("a", "risky", '{"x": 1}')]
    assert "approval_requested" in kinds(events)


async def test_a_denial_in_a_continuation_is_fed_back_to_the_model() -> None:
    tool = GatedTool()
    provider = ScriptedProvider([[Call.of("risky", {}, call_id="a")], [Text("Understood.")]])
    async with running_gateway(provider=provider, executors=[FunctionExecutor(), tool]) as gw:
        first = await gw.create(_approval_request([needs_approval(function_tool("risky"))]))
        follow = pb.CreateResponseRequest(previous_response_id=first.id)
        follow.tools.append(needs_approval(function_tool("risky")))
        follow.input_items.items.add().approval_response.CopyFrom(
            pb.ApprovalResponse(call_id="a", approve=False, reason="too risky")
        )
        second = await gw.create(follow)
    assert not tool.calls
    assert second.output[0].function_call_output.is_error
    assert "too risky" in second.output[0].function_call_output.output
    assert output_text(second) == "Understood."


# -- pause and resume --------------------------------------------------------------------------------


async def test_pause_takes_effect_at_the_next_check_point_and_resume_continues() -> None:
    hold = asyncio.Event()
    provider = ScriptedProvider([Turn([Call.of("fast", {}, call_id="c")], hold=hold), [Text("Done.")]])
    async with running_gateway(provider=provider, executors=[FunctionExecutor(), GatedTool()]) as gw:
        session = Session(gw)
        request = user("go")
        request.tools.append(function_tool("fast"))
        await session.start(request)
        await session.until("created")
        await provider.holding.wait()
        await session.accepted(gw, pb.Control(pause=pb.PauseControl(reason="review")))
        hold.set()
        paused = await session.until("paused")
        assert paused.paused.reason == "review"
        assert not any(kind(e) == "tool_execution_in_progress" for e in session.events), "paused before tools start"
        await session.send(pb.Control(resume=pb.ResumeControl()))
        await session.until("resumed")
        terminal = await session.until("terminal")
    assert_valid_stream(session.response_events())
    assert terminal.completed.response.status == S.RESPONSE_STATUS_COMPLETED


async def test_cancel_while_paused_ends_the_response_cancelled() -> None:
    hold = asyncio.Event()
    provider = ScriptedProvider([Turn([Call.of("fast", {}, call_id="c")], hold=hold), [Text("never")]])
    async with running_gateway(provider=provider, executors=[FunctionExecutor(), GatedTool()]) as gw:
        request = pb.CreateResponseRequest(input_text="hi", stream=True, tools=[function_tool("fast")])
        call = gw.stub.CreateResponse(request)
        created = (await call.read()).event.created.response.id
        await provider.holding.wait()
        pause = pb.Control(pause=pb.PauseControl(reason="wait"))
        await gw.stub.ControlResponse(pb.ControlResponseRequest(response_id=created, control=pause))
        hold.set()
        events = [(await call.read()).event]
        while kind(events[-1]) != "paused":
            events.append((await call.read()).event)
        cancel = pb.Control(cancel=pb.CancelControl())
        await gw.stub.ControlResponse(pb.ControlResponseRequest(response_id=created, control=cancel))
        rest = await drain(call)
        stored = await gw.store.get(created)
    assert kind(rest[-1]) == "cancelled"
    assert stored is not None and stored.response.status == S.RESPONSE_STATUS_CANCELLED


async def test_the_deadline_while_paused_fails_the_response() -> None:
    hold = asyncio.Event()
    provider = ScriptedProvider([Turn([Call.of("fast", {}, call_id="c")], hold=hold), [Text("late")]])
    async with running_gateway(provider=provider, executors=[FunctionExecutor(), GatedTool()]) as gw:
        session = Session(gw, timeout=6)
        request = user("hi")
        request.tools.append(function_tool("fast"))
        await session.start(request)
        await session.until("created")
        await provider.holding.wait()
        await session.accepted(gw, pb.Control(pause=pb.PauseControl(reason="hold on")))
        hold.set()
        await session.until("paused")
        terminal = await session.until("terminal")
    assert_valid_stream(session.response_events())
    assert terminal.failed.response.error.code == "deadline_exceeded"


# -- unary control ------------------------------------------------------------------------------------


async def test_a_response_started_by_create_response_is_steered_by_control_response() -> None:
    hold = asyncio.Event()
    provider = ScriptedProvider([Turn([Text("one two three")], hold=hold, hold_at=1), [Text("Steered.")]])
    async with running_gateway(provider=provider) as gw:
        call = gw.stub.CreateResponse(pb.CreateResponseRequest(input_text="hi", stream=True))
        created = (await call.read()).event.created.response.id
        await provider.holding.wait()
        answer = await gw.stub.ControlResponse(pb.ControlResponseRequest(response_id=created, control=steer("shorter")))
        assert answer.response.id == created
        hold.set()
        events = await drain(call)
    assert events[-1].completed.response.output[-1].message.content[0].output_text.text == "Steered."
    assert "input_injected" in kinds(events)


# -- bad input -----------------------------------------------------------------------------------------


async def _code(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await (call.read() if hasattr(call, "read") else call)
    return info.value.code(), info.value.details() or ""


async def drain(call: Any) -> list[pb.StreamEvent]:
    """The rest of a CreateResponse stream already read with `read()` (iteration cannot mix)."""
    events = []
    while (message := await call.read()) is not grpc.aio.EOF:
        events.append(message.event)
    return events


async def test_control_of_an_unknown_response_is_not_found() -> None:
    async with running_gateway(provider=ScriptedProvider([[Text("x")]])) as gw:
        code, _ = await _code(
            gw.stub.ControlResponse(pb.ControlResponseRequest(response_id="resp_nope", control=steer("x")))
        )
    assert code == grpc.StatusCode.NOT_FOUND


async def test_control_of_a_finished_response_is_a_failed_precondition() -> None:
    async with running_gateway(provider=ScriptedProvider([[Text("x")]])) as gw:
        done = await gw.create(user("hi"))
        code, _ = await _code(
            gw.stub.ControlResponse(pb.ControlResponseRequest(response_id=done.id, control=steer("x")))
        )
    assert code == grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.parametrize(
    ("control", "code"),
    [
        (pb.Control(steer=pb.SteerControl()), grpc.StatusCode.INVALID_ARGUMENT),
        (pb.Control(), grpc.StatusCode.INVALID_ARGUMENT),
        (approval("", True), grpc.StatusCode.INVALID_ARGUMENT),
        (approval("call_nobody_waits_for", True), grpc.StatusCode.FAILED_PRECONDITION),
        (pb.Control(resume=pb.ResumeControl()), grpc.StatusCode.FAILED_PRECONDITION),
        (
            pb.Control(steer=pb.SteerControl(items=[pb.Item(function_call_output=pb.FunctionCallOutput(call_id="c"))])),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
    ],
    ids=[
        "empty-steer",
        "no-control",
        "approval-without-call",
        "approval-nobody-awaits",
        "resume-not-paused",
        "steer-not-a-message",
    ],
)
async def test_a_bad_control_is_refused_and_the_run_goes_on(control: pb.Control, code: grpc.StatusCode) -> None:
    hold = asyncio.Event()
    # Both responses (the unary one and the session's) wait until the controls were refused.
    provider = ScriptedProvider([Turn([Text("still fine")], hold=hold), Turn([Text("also fine")], hold=hold)])
    async with running_gateway(provider=provider) as gw:
        call = gw.stub.CreateResponse(pb.CreateResponseRequest(input_text="hi", stream=True))
        created = (await call.read()).event.created.response.id
        await provider.holding.wait()
        got, _ = await _code(gw.stub.ControlResponse(pb.ControlResponseRequest(response_id=created, control=control)))
        assert got == code
        # On a Converse stream the same control is refused in-band.
        session = Session(gw)
        await session.start(user("second"))
        await session.send(control)
        await session.until("rejected")
        assert session.rejected[0].code == code.value[0]
        hold.set()
        events = await drain(call)
        await session.call.done_writing()
        terminal = await session.until("terminal")
    assert events[-1].completed.response.status == S.RESPONSE_STATUS_COMPLETED
    assert terminal.WhichOneof("event") in TERMINAL


async def test_a_first_converse_message_that_is_not_a_create_is_invalid() -> None:
    async with running_gateway(provider=ScriptedProvider([[Text("x")]])) as gw:
        call = gw.stub.Converse()
        await call.write(pb.ConverseRequest(control=steer("hi")))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_continuation_output_for_no_waiting_call_is_invalid() -> None:
    provider = ScriptedProvider([[Call.of("get_weather", {}, call_id="w")]])
    async with running_gateway(provider=provider) as gw:
        first = await gw.create(_approval_request([function_tool("get_weather")]))
        follow = pb.CreateResponseRequest(previous_response_id=first.id)
        follow.input_items.items.add().function_call_output.CopyFrom(pb.FunctionCallOutput(call_id="nope", output="1"))
        code, details = await _code(gw.stub.CreateResponse(follow))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "input_items.items[0].function_call_output.call_id" in details


async def test_a_continuation_cannot_run_a_server_call_the_model_never_made() -> None:
    tool = GatedTool()
    provider = ScriptedProvider([[Text("hello")], [Text("ok")]])
    async with running_gateway(provider=provider, executors=[FunctionExecutor(), tool]) as gw:
        first = await gw.create(user("hi"))
        follow = pb.CreateResponseRequest(previous_response_id=first.id)
        follow.tools.append(function_tool("risky"))
        follow.input_items.items.add().function_call.CopyFrom(
            pb.FunctionCall(call_id="x", name="risky", arguments="{}")
        )
        second = await gw.create(follow)
    assert second.status == S.RESPONSE_STATUS_COMPLETED
    assert not tool.calls


# -- one stream, several responses ------------------------------------------------------------------------


async def test_one_converse_stream_carries_a_chat_of_several_responses() -> None:
    provider = ScriptedProvider([[Text("Hi!")], [Text("You said hello.")]])
    async with running_gateway(provider=provider) as gw:
        session = Session(gw)
        await session.start(user("hello"))
        first = await session.until("terminal")
        follow = user("what did I say?")
        follow.previous_response_id = first.completed.response.id
        await session.start(follow)
        second = await session.until("terminal")
        await session.call.done_writing()
        assert await session.call.read() is grpc.aio.EOF
    assert second.completed.response.previous_response_id == first.completed.response.id
    assert_valid_stream(session.response_events())
    texts = [
        i.message.content[0].input_text.text for i in provider.requests[1].items if i.message.role == pb.Role.ROLE_USER
    ]
    assert texts == ["hello", "what did I say?"]
