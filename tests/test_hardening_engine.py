"""What an attacker's pass found in the loop, each as the scenario that broke it: a client deciding
what a server runs by reusing a call id, a follow-up queue without a bound, and a fail-closed hook
that failed at the end of a response without a terminal event."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from antwort_grpc import pb
from antwort_grpc.hooks import PolicyHook
from antwort_grpc.hooks.server import HookServicer
from antwort_grpc.hooks.service import Point
from antwort_grpc.hooks.steps import HookFailure
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text
from tests.fakes import MockExecutor, echo
from tests.harness import final, function_tool, running_gateway, user
from tests.hooks.test_session import gateway_with, hook_server
from tests.test_interactive_runs import GatedTool, Session, follow_up

S = pb.ResponseStatus


def run_code_request(*items: pb.Item, previous: str = "") -> pb.CreateResponseRequest:
    request = pb.CreateResponseRequest(previous_response_id=previous)
    request.input_items.items.extend(items)
    tool = function_tool("run_code", code="string")
    tool.require_approval.mode = pb.ApprovalMode.APPROVAL_MODE_ALWAYS
    request.tools.append(tool)
    return request


def message(text: str) -> pb.Item:
    part = pb.ContentPart(input_text=pb.InputText(text=text))
    return pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[part]))


def client_call(call_id: str, code: str) -> pb.Item:
    return pb.Item(function_call=pb.FunctionCall(call_id=call_id, name="run_code", arguments=f'{{"code": "{code}"}}'))


def output(call_id: str, text: str) -> pb.Item:
    return pb.Item(function_call_output=pb.FunctionCallOutput(call_id=call_id, output=text))


def decision(call_id: str, approve: bool) -> pb.Item:
    return pb.Item(approval_response=pb.ApprovalResponse(call_id=call_id, approve=approve, reason="no"))


async def test_a_reused_call_id_never_runs_the_clients_code_on_a_server_executor() -> None:
    provider = ScriptedProvider([[Call.of("run_code", {"code": "print(1)"}, call_id="c1")], [Text("Denied.")]])
    sandbox = MockExecutor({"run_code": echo})
    async with running_gateway(provider=provider, executors=[sandbox]) as gw:
        asked = await gw.create(run_code_request(message("run it")))
        assert asked.status == S.RESPONSE_STATUS_REQUIRES_ACTION
        denied = await gw.create(run_code_request(decision("c1", False), previous=asked.id))
        assert denied.status == S.RESPONSE_STATUS_COMPLETED
        # The call now has its output; the client names it again with code of its own.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await gw.create(run_code_request(client_call("c1", "import os; os.system('id')"), previous=denied.id))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "already used" in (refused.value.details() or "")
    assert sandbox.calls == [], "nothing ran: the model's call was denied, the client's was refused"


async def test_a_second_output_for_an_answered_call_is_invalid_argument() -> None:
    provider = ScriptedProvider([[Call.of("get_weather", {"city": "Paris"}, call_id="c1")], [Text("22C.")]])
    async with running_gateway(provider=provider) as gw:
        request = user("Weather?")
        request.tools.append(function_tool("get_weather", city="string"))
        asked = await gw.create(request)
        answered = pb.CreateResponseRequest(previous_response_id=asked.id)
        answered.input_items.items.append(output("c1", "22C"))
        done = await gw.create(answered)
        again = pb.CreateResponseRequest(previous_response_id=done.id)
        again.input_items.items.append(output("c1", "-40C"))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await gw.create(again)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "already has an output" in (refused.value.details() or "")


async def test_a_server_call_a_continuation_runs_passes_the_approval_hooks_again() -> None:
    """The server call of a mixed turn runs when the client answers its own call — and the
    approve-tool hooks are asked about it then, like for any call that is about to run (here the
    policy changed while the response waited for the client)."""
    provider = ScriptedProvider(
        [
            [Call.of("get_weather", {"city": "Paris"}, call_id="client"), Call.of("rm", {"q": "/"}, call_id="srv")],
            [Text("Done.")],
        ]
    )
    executor = MockExecutor({"rm": echo})
    async with (
        hook_server(HookServicer(DeniesRmTheSecondTime())) as target,
        running_gateway(provider=provider, executors=[executor], hooks=[target]) as gw,
    ):
        request = user("Weather, then clean up")
        request.tools.extend([function_tool("get_weather", city="string"), function_tool("rm", q="string")])
        first = await gw.create(request)
        assert first.status == S.RESPONSE_STATUS_REQUIRES_ACTION
        follow = pb.CreateResponseRequest(previous_response_id=first.id, tools=request.tools)
        follow.input_items.items.append(output("client", "22C"))
        second = await gw.create(follow)
    outputs = {
        i.function_call_output.call_id: i.function_call_output
        for i in second.output
        if i.HasField("function_call_output")
    }
    assert outputs["srv"].is_error and "not on this host" in outputs["srv"].output
    assert executor.calls == [], "the denied call never ran"


class DeniesRmTheSecondTime(PolicyHook):
    name = "denies-rm"

    def __init__(self) -> None:
        self.asked = 0

    async def approve_tool(self, request: pb.ApproveToolRequest) -> pb.ApproveToolResponse:
        if request.call.name != "rm":
            return pb.ApproveToolResponse()
        self.asked += 1
        if self.asked == 1:
            return pb.ApproveToolResponse()  # no objection yet
        return pb.ApproveToolResponse(decision=pb.ApproveToolResponse.DECISION_DENY, reason="not on this host")


async def test_follow_ups_beyond_the_cap_are_refused_and_the_run_still_ends() -> None:
    tool = GatedTool()  # holds the run in its tool call while the follow-ups arrive
    provider = ScriptedProvider([[Call.of("slow", {}, call_id="s")], [Text("First answer.")]] + [[Text("More.")]] * 16)
    async with running_gateway(provider=provider, executors=[tool], max_turns=30) as gw:
        session = Session(gw)
        request = user("Start")
        request.tools.append(function_tool("slow"))
        await session.start(request)
        await session.until("tool_execution_in_progress")
        for n in range(17):
            await session.send(follow_up(f"follow-up {n}"))
        await session.until("rejected")
        rejected = session.rejected[-1]
        tool.release.set()
        terminal = await session.until("terminal")
    assert len(session.rejected) == 1, "the first 16 were queued"
    assert rejected.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert rejected.reason == "follow_up_queue_full"
    assert terminal.completed.response.status == S.RESPONSE_STATUS_COMPLETED


class SlowAtTheEnd(PolicyHook):
    """Misses its deadline at one observing point."""

    def __init__(self, point: str) -> None:
        self.point = point
        self.name = f"slow-at-{point}"

    async def after_model(self, request: pb.AfterModelRequest) -> pb.AfterModelResponse:
        if self.point == "after_model":
            await asyncio.sleep(5)
        return pb.AfterModelResponse()

    async def after_response(self, request: pb.AfterResponseRequest) -> pb.AfterResponseResponse:
        if self.point == "after_response":
            await asyncio.sleep(5)
        return pb.AfterResponseResponse()


@pytest.mark.parametrize("point", ["after_model", "after_response"])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_fail_closed_hook_that_times_out_at_the_end_still_ends_in_the_terminal_event(
    point: str, stream: bool
) -> None:
    provider = ScriptedProvider([[Text("Hi.")]])
    async with (
        hook_server(HookServicer(SlowAtTheEnd(point))) as target,
        gateway_with(f"{target};failure=closed", provider, hook_timeout=0.2) as gw,
    ):
        request = user("hi")
        if stream:
            response = final(await gw.stream(request))
        else:
            response = await gw.create(request)
        stored = (await gw.stub.GetResponse(pb.GetResponseRequest(response_id=response.id))).response
    assert response.status == S.RESPONSE_STATUS_FAILED and response.error.code == "hook_failed"
    assert point in response.error.message
    assert stored.status == S.RESPONSE_STATUS_FAILED, "stored with its final status"


async def test_a_server_call_approved_in_a_continuation_runs_with_its_execution_events_and_progress() -> None:
    provider = ScriptedProvider([[Call.of("run_code", {"code": "print(1)"}, call_id="c1")], [Text("Ran it.")]])
    sandbox = MockExecutor({"run_code": echo}, progress_messages=["compiling", "running"])
    async with running_gateway(provider=provider, executors=[sandbox]) as gw:
        asked = await gw.create(run_code_request(message("run it")))
        assert asked.status == S.RESPONSE_STATUS_REQUIRES_ACTION and sandbox.calls == []
        events = await gw.stream(run_code_request(decision("c1", True), previous=asked.id))
    names = [e.WhichOneof("event") for e in events]
    execution = [n for n in names if n.startswith("tool_execution_")]
    assert execution == [
        "tool_execution_in_progress",
        "tool_execution_progress",
        "tool_execution_progress",
        "tool_execution_completed",
    ], names
    progress = [e.tool_execution_progress for e in events if e.HasField("tool_execution_progress")]
    assert [(p.call_id, p.message) for p in progress] == [("c1", "compiling"), ("c1", "running")]
    assert final(events).status == S.RESPONSE_STATUS_COMPLETED and [c.call_id for c in sandbox.calls] == ["c1"]


class DeniesEveryWay(PolicyHook):
    """Denies run_code at the point the test names: on the approval path, before the tool runs,
    or by failing (fail-closed) there."""

    name = "deny-every-way"

    def __init__(self, how: str) -> None:
        self.how = how

    async def approve_tool(self, request: pb.ApproveToolRequest) -> pb.ApproveToolResponse:
        if self.how == "approve_tool":
            return pb.ApproveToolResponse(decision=pb.ApproveToolResponse.DECISION_DENY, reason="not today")
        return pb.ApproveToolResponse()

    async def before_tool(self, request: pb.BeforeToolRequest) -> pb.BeforeToolResponse:
        if self.how == "crash":
            raise RuntimeError("the rules are unreadable")
        if self.how == "before_tool":
            return pb.BeforeToolResponse(deny_reason="not today")
        return pb.BeforeToolResponse()


@pytest.mark.parametrize("how", ["approve_tool", "before_tool", "crash"])
async def test_a_hooks_denial_shown_to_the_model_never_names_where_the_hook_runs(how: str) -> None:
    provider = ScriptedProvider([[Call.of("run_code", {"code": "print(1)"}, call_id="c1")], [Text("Denied.")]])
    sandbox = MockExecutor({"run_code": echo})
    async with (
        hook_server(HookServicer(DeniesEveryWay(how))) as target,
        running_gateway(provider=provider, executors=[sandbox], hooks=[f"{target};failure=closed;timeout=5"]) as gw,
    ):
        request = run_code_request(message("run it"))
        if how != "approve_tool":
            request.tools[0].ClearField("require_approval")
        response = final(await gw.stream(request))
    assert sandbox.calls == [], "the call was denied"
    shown = [i.function_call_output for i in provider.requests[-1].items if i.HasField("function_call_output")]
    assert len(shown) == 1 and shown[0].is_error, shown
    stored = next(i.function_call_output for i in response.output if i.HasField("function_call_output"))
    for text in (shown[0].output, stored.output):
        assert target not in text and "127.0.0.1" not in text, f"the hook's address is in {text!r}"
    if how != "approve_tool":
        assert "deny-every-way" in shown[0].output, "the hook is named by its own name"


def test_a_hook_failure_the_model_reads_leaves_out_every_address_in_the_error() -> None:
    """A hook that went away mid-run: gRPC's error names where it ran, in more than one spelling."""
    error = (
        "AioRpcError: UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: "
        "ipv4:10.1.2.3:7070: Connection refused (hooks.internal:7070, ipv6:[fd00::5]:7070)"
    )
    failure = HookFailure("policy (hooks.internal:7070)", Point.HOOK_POINT_BEFORE_TOOL, error, "c1",
                          label="policy", target="hooks.internal:7070")  # fmt: skip
    shown = failure.shown()
    assert shown.startswith("hook policy failed at before_tool: AioRpcError: UNAVAILABLE")
    for address in ("10.1.2.3", "hooks.internal", "fd00::5", "7070"):
        assert address not in shown, shown
    assert "hooks.internal:7070" in failure.describe(), "the operator's log keeps it"
