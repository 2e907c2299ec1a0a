"""A hook service's Session: every call through one stream, calls that follow each other in one
exchange, and the unary RPCs for services without it. The recording services here are real gRPC
servers on loopback ports (HookServicer subclasses that note what each exchange carried); the
restart test runs the hook service as a process of its own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from antwort_grpc import pb
from antwort_grpc.engine.hook_gate import HookGate
from antwort_grpc.executors.base import FunctionExecutor
from antwort_grpc.hooks import Dispatcher, LocalHook, PolicyHook
from antwort_grpc.hooks.dispatch import HookRun
from antwort_grpc.hooks.server import HookServicer, serve_hook
from antwort_grpc.hooks.service import POINTS, Caller
from antwort_grpc.providers.base import TurnRequest
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text
from tests.executors.remote_services import free_port, start_process, stop_process
from tests.fakes import MockExecutor, echo
from tests.harness import GatewayClient, final, function_tool, kinds, running_gateway, user
from tests.hooks.hook_services import Gatekeeper, Recorder, read_record
from tests.test_interactive_runs import GatedTool, steer
from tests.test_interactive_runs import Session as InteractiveSession

S = pb.ResponseStatus
P = pb.HookPoint


class RecordingSession(HookServicer):
    """Notes the points of every Session exchange and every unary call it gets."""

    def __init__(self, hook: PolicyHook, session: bool = True) -> None:
        super().__init__(hook)
        self.session = session
        self.exchanges: list[list[str]] = []
        self.unary: list[str] = []
        for spec in POINTS.values():
            setattr(self, spec.rpc, self._noted(spec.method, getattr(self, spec.rpc)))

    def _noted(self, method: str, rpc: Any) -> Any:
        async def noted(request: Any, context: Any) -> Any:
            self.unary.append(method)
            return await rpc(request, context)

        return noted

    async def GetHookInfo(self, request: pb.GetHookInfoRequest, context: Any) -> pb.GetHookInfoResponse:
        info = await super().GetHookInfo(request, context)
        info.session = self.session
        return info

    async def _exchange(self, request: pb.SessionRequest) -> pb.SessionResponse:
        self.exchanges.append([c.WhichOneof("point") or "" for c in request.calls])
        return await super()._exchange(request)


@asynccontextmanager
async def hook_server(servicer: HookServicer, port: int = 0) -> AsyncIterator[str]:
    running = await serve_hook(servicer.hook, f"127.0.0.1:{port}", servicer)
    try:
        yield running.target
    finally:
        await running.stop(0)


@asynccontextmanager
async def gateway_with(target: str, provider: ScriptedProvider, **settings: Any) -> AsyncIterator[GatewayClient]:
    executors = [MockExecutor({"lookup": echo, "rm": echo})]
    async with running_gateway(provider=provider, executors=executors, hooks=[target], **settings) as gw:
        yield gw


def lookup_then_answer(*calls: Call) -> ScriptedProvider:
    return ScriptedProvider([list(calls or [Call.of("lookup", {"q": "x"}, call_id="call_1")]), [Text("Done.")]])


def tools_request(*names: str) -> pb.CreateResponseRequest:
    request = user("Look it up")
    for name in names or ("lookup",):
        request.tools.append(function_tool(name, q="string"))
    return request


async def test_calls_that_follow_each_other_come_in_one_exchange() -> None:
    service = RecordingSession(Recorder())
    async with hook_server(service) as target, gateway_with(target, lookup_then_answer()) as gw:
        response = final(await gw.stream(tools_request()))
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    assert service.exchanges == [
        # The first model call's hooks are asked ahead, with the request's.
        ["before_response", "pause_check", "before_model"],
        ["after_model", "pause_check", "approve_tool", "before_tool"],
        # The turn's one call: the next model call's hooks are asked ahead, with its result's.
        ["after_tool", "pause_check", "before_model"],
        ["after_model", "after_response"],
    ]
    assert service.unary == [], "a service with Session gets no unary call"
    assert response.metrics.hook_calls == 12 and response.metrics.hook_failures == 0


async def test_service_without_session_gets_one_rpc_per_call() -> None:
    service = RecordingSession(Recorder(), session=False)
    async with hook_server(service) as target, gateway_with(target, lookup_then_answer()) as gw:
        response = final(await gw.stream(tools_request()))
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    assert service.exchanges == []
    assert service.unary == [
        "before_response",
        "pause_check",
        "before_model",
        "after_model",
        "pause_check",
        "approve_tool",
        "before_tool",
        "after_tool",
        "pause_check",
        "before_model",
        "after_model",
        "after_response",
    ]


async def test_service_that_says_session_but_lacks_it_gets_unary_calls() -> None:
    class NoSession(RecordingSession):
        Session = pb.HookServiceServicer.Session  # the generated default: UNIMPLEMENTED

    service = NoSession(Recorder())
    async with hook_server(service) as target, gateway_with(target, lookup_then_answer()) as gw:
        response = final(await gw.stream(tools_request()))
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    assert response.metrics.hook_failures == 0, "the exchange that found out went over unary calls"
    assert service.unary[:2] == ["before_response", "pause_check"] and len(service.unary) == 12


class PausesAtTurnOne(Recorder):
    name = "pauses-at-turn-one"

    async def pause_check(self, request: pb.PauseCheckRequest) -> pb.PauseCheckResponse:
        await super().pause_check(request)
        if request.check_point == pb.PauseCheckRequest.CHECK_POINT_TURN_BOUNDARY and request.context.turn == 1:
            return pb.PauseCheckResponse(pause=True, reason="review turn 1")
        return pb.PauseCheckResponse()


async def test_a_pause_ends_the_exchange_and_the_model_call_is_asked_after_the_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("HOOK_RECORD", str(record))  # the in-process Recorder writes there
    service = RecordingSession(PausesAtTurnOne())
    async with hook_server(service) as target, gateway_with(target, lookup_then_answer()) as gw:
        request = tools_request()
        request.stream = True
        events: list[pb.StreamEvent] = []
        async for message in gw.stub.CreateResponse(request):
            events.append(message.event)
            if kinds(events)[-1] == "paused":
                rid = events[0].created.response.id
                resume = pb.ControlResponseRequest(response_id=rid, control=pb.Control(resume=pb.ResumeControl()))
                await gw.stub.ControlResponse(resume)
    assert final(events).status == S.RESPONSE_STATUS_COMPLETED
    names = kinds(events)
    assert names.index("paused") < names.index("resumed") < len(names) - 1
    assert service.exchanges[2:4] == [["after_tool", "pause_check", "before_model"], ["before_model"]], (
        "the pause answered the exchange; the model call was asked on its own after the resume"
    )
    seen = [(s["point"], s.get("turn")) for s in read_record(str(record))]
    assert seen.count(("before_model", 2)) == 1 and seen.count(("pause_check", 1)) == 2


async def test_a_call_denied_in_an_exchange_is_never_asked_before_tool(tmp_path: Path) -> None:
    class Gate(Gatekeeper):
        async def before_tool(self, request: pb.BeforeToolRequest) -> pb.BeforeToolResponse:
            return pb.BeforeToolResponse()

    service = RecordingSession(Gate())
    provider = lookup_then_answer(
        Call.of("rm", {"q": "/"}, call_id="c_rm"), Call.of("lookup", {"q": "x"}, call_id="c_ok")
    )
    async with hook_server(service) as target, gateway_with(target, provider) as gw:
        response = final(await gw.stream(tools_request("rm", "lookup")))
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    assert service.exchanges == [
        # The deny ends the exchange; the approval of lookup ends the next; its before-tool call last.
        ["approve_tool", "approve_tool", "before_tool", "before_tool"],
        ["approve_tool", "before_tool"],
        ["before_tool"],
    ]
    outputs = [i.function_call_output for i in response.output if i.WhichOneof("kind") == "function_call_output"]
    assert outputs[0].is_error and "destructive" in outputs[0].output and not outputs[1].is_error


class ChangesTheRequest(Recorder):
    name = "changes-the-request"

    async def before_response(self, request: pb.BeforeResponseRequest) -> pb.BeforeResponseResponse:
        await super().before_response(request)
        changed = pb.CreateResponseRequest()
        changed.CopyFrom(request.request)
        changed.instructions = "Answer in French."
        return pb.BeforeResponseResponse(request=changed)

    async def before_model(self, request: pb.BeforeModelRequest) -> pb.BeforeModelResponse:
        await super().before_model(request)
        assert request.call.instructions == "Answer in French.", "never asked about the request that is no more"
        return pb.BeforeModelResponse()


async def test_a_changed_request_is_prepared_again_and_its_first_call_asked_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("HOOK_RECORD", str(record))
    service = RecordingSession(ChangesTheRequest())
    provider = ScriptedProvider([[Text("Bonjour.")]])
    async with hook_server(service) as target, gateway_with(target, provider) as gw:
        response = final(await gw.stream(user("hi")))
    assert response.status == S.RESPONSE_STATUS_COMPLETED and response.metrics.hook_failures == 0
    assert provider.requests[0].instructions == "Answer in French."
    assert service.exchanges[:2] == [
        ["before_response", "pause_check", "before_model"],
        ["pause_check", "before_model"],
    ]
    seen = [s["point"] for s in read_record(str(record))]
    assert seen[:3] == ["before_response", "pause_check", "before_model"], "each asked once"
    assert read_record(str(record))[0]["response_id"] == response.id, "the response keeps the id the hook saw"


class BracketsResults(Recorder):
    name = "brackets-results"

    async def after_tool(self, request: pb.AfterToolRequest) -> pb.AfterToolResponse:
        await super().after_tool(request)
        return pb.AfterToolResponse(result=pb.FunctionCallOutput(output=f"[{request.result.output}]"))

    async def before_model(self, request: pb.BeforeModelRequest) -> pb.BeforeModelResponse:
        await super().before_model(request)
        outputs = [i.function_call_output.output for i in request.call.items if i.HasField("function_call_output")]
        assert all(o.startswith("[") for o in outputs), "never asked about a result that is no more"
        return pb.BeforeModelResponse()


async def test_a_changed_result_has_the_next_model_call_asked_about_at_its_boundary() -> None:
    service = RecordingSession(BracketsResults())
    provider = lookup_then_answer()
    async with hook_server(service) as target, gateway_with(target, provider) as gw:
        response = final(await gw.stream(tools_request()))
    assert response.status == S.RESPONSE_STATUS_COMPLETED and response.metrics.hook_failures == 0
    assert service.exchanges[2:4] == [["after_tool", "pause_check", "before_model"], ["pause_check", "before_model"]]
    [output] = [i.function_call_output for i in provider.requests[1].items if i.HasField("function_call_output")]
    assert output.output.startswith("[")


class SkipsCalls(RecordingSession):
    """Answers every exchange with nothing at all: the hook's failure, not a silent pass."""

    async def _exchange(self, request: pb.SessionRequest) -> pb.SessionResponse:
        self.exchanges.append([c.WhichOneof("point") or "" for c in request.calls])
        return pb.SessionResponse(exchange_id=request.exchange_id)


async def test_an_exchange_answered_with_nothing_is_the_hooks_failure() -> None:
    service = SkipsCalls(Recorder())
    provider = ScriptedProvider([[Text("Hi.")]])
    async with hook_server(service) as target, gateway_with(f"{target};failure=open", provider) as gw:
        events = await gw.stream(user("hi"))
    assert final(events).status == S.RESPONSE_STATUS_COMPLETED
    failed = [e.hook_failed for e in events if e.WhichOneof("event") == "hook_failed"]
    assert failed and failed[0].error == "it answered 0 of 3 calls"
    async with hook_server(SkipsCalls(Recorder())) as target, gateway_with(f"{target};failure=closed", provider) as gw:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await gw.stream(user("hi"))
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, "fail-closed before the response: it is refused"
    assert "it answered 0 of 3 calls" in (refused.value.details() or "")


async def test_hook_service_that_restarts_gets_a_new_session() -> None:
    port = free_port()
    listen = ("hook", "run", "tests.hooks.hook_services:Recorder", "--listen", f"127.0.0.1:{port}")
    child = await start_process(*listen)
    provider = ScriptedProvider([[Text("One.")], [Text("Two.")]] + [[Text("Three.")]] * 40)
    try:
        async with gateway_with(f"127.0.0.1:{port};failure=open;timeout=2", provider) as gw:
            first = await gw.stream(user("one"))
            await stop_process(child.proc)
            down = await gw.stream(user("two"))
            child = await start_process(*listen)
            # The gateway's channel reconnects with a backoff of at most 2 s: until then the
            # service still counts as down.
            for _ in range(40):
                again = await gw.stream(user("three"))
                if final(again).metrics.hook_failures == 0:
                    break
                await asyncio.sleep(0.25)
    finally:
        await stop_process(child.proc)
    assert [final(e).status for e in (first, down, again)] == [S.RESPONSE_STATUS_COMPLETED] * 3
    assert final(first).metrics.hook_failures == 0
    assert final(down).metrics.hook_failures > 0, "the service was down: its failure policy applied"
    assert final(again).metrics.hook_failures == 0, "once it is back, a new session carries the calls"


class AfterModelDown(PolicyHook):
    name = "after-model-down"

    async def after_model(self, request: pb.AfterModelRequest) -> pb.AfterModelResponse:
        raise RuntimeError("audit log unavailable")


async def test_an_observation_that_fails_closed_fails_the_response() -> None:
    provider = ScriptedProvider([[Text("Hi.")]])
    async with (
        hook_server(HookServicer(AfterModelDown())) as target,
        gateway_with(f"{target};failure=closed", provider) as gw,
    ):
        response = final(await gw.stream(user("hi")))
    assert response.status == S.RESPONSE_STATUS_FAILED and response.error.code == "hook_failed"
    assert "after_model" in response.error.message and "audit log unavailable" in response.error.message


class CountsModelCalls(PolicyHook):
    """Changes each model call's instructions to say how many times it was asked."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    async def before_model(self, request: pb.BeforeModelRequest) -> pb.BeforeModelResponse:
        self.asked.append(len(request.call.items))
        return pb.BeforeModelResponse(change=pb.ModelCallChange(instructions=f"asked {len(self.asked)}"))


async def test_a_first_call_asked_ahead_is_asked_again_when_its_context_changed() -> None:
    hook = CountsModelCalls()
    request = user("hi")
    governor = gate_of(hook)
    first = TurnRequest(model="m", instructions="", items=[user_item("hi")], tools=[])
    assert await governor.admit(request, lambda r: [], first) is request
    assert hook.asked == [1], "asked ahead, with the request's own hooks"
    unchanged = await governor.before_model(1, first, pause=True)
    assert isinstance(unchanged, TurnRequest) and unchanged.instructions == "asked 1", "the answer kept"
    assert hook.asked == [1]

    governor = gate_of(hook)
    await governor.admit(request, lambda r: [], first)
    steered = TurnRequest(model="m", instructions="", items=[user_item("hi"), user_item("in French")], tools=[])
    decided = await governor.before_model(1, steered, pause=True)
    assert isinstance(decided, TurnRequest) and decided.instructions == "asked 3"
    assert hook.asked == [1, 1, 2], "a steering message came first: asked again, about the call made"


def gate_of(hook: PolicyHook) -> HookGate:
    return HookGate(Dispatcher([LocalHook(hook, 1.0, False)]), HookRun(Caller(), pb.HookContext()))


def user_item(text: str) -> pb.Item:
    return pb.Item(
        message=pb.Message(role=pb.Role.ROLE_USER, content=[pb.ContentPart(input_text=pb.InputText(text=text))])
    )


class WaitsForever(PolicyHook):
    name = "waits-forever"

    def __init__(self) -> None:
        self.given_up = asyncio.Event()

    async def before_model(self, request: pb.BeforeModelRequest) -> pb.BeforeModelResponse:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.given_up.set()
            raise
        raise AssertionError("unreachable")


async def test_a_service_gives_up_an_exchange_when_the_gateways_timeout_passed() -> None:
    hook = WaitsForever()
    provider = ScriptedProvider([[Text("Hi.")]])
    async with (
        hook_server(HookServicer(hook)) as target,
        gateway_with(f"{target};failure=open;timeout=0.3", provider) as gw,
    ):
        events = await gw.stream(user("hi"))
        async with asyncio.timeout(10):
            await hook.given_up.wait()  # the exchange carried the timeout: no task left hanging
    assert final(events).status == S.RESPONSE_STATUS_COMPLETED
    [failed] = [e.hook_failed for e in events if e.WhichOneof("event") == "hook_failed"]
    assert failed.point == P.HOOK_POINT_BEFORE_MODEL and "no answer within 0.3s" in failed.error


async def test_an_exchange_may_carry_a_large_context() -> None:
    service = RecordingSession(Recorder())
    provider = ScriptedProvider([[Text("Read it.")]])
    big = "x" * (6 * 1024 * 1024)  # more than gRPC's default 4 MiB per message, twice in one exchange
    async with hook_server(service) as target, gateway_with(target, provider) as gw:
        response = final(await gw.stream(user(big)))
    assert response.status == S.RESPONSE_STATUS_COMPLETED and response.metrics.hook_failures == 0
    assert service.exchanges[0] == ["before_response", "pause_check", "before_model"]


class Audits(PolicyHook):
    """Observes model output and the response only."""

    name = "audits"

    def __init__(self) -> None:
        self.model_output_seen = asyncio.Event()

    async def after_model(self, request: pb.AfterModelRequest) -> pb.AfterModelResponse:
        self.model_output_seen.set()
        return pb.AfterModelResponse()

    async def after_response(self, request: pb.AfterResponseRequest) -> pb.AfterResponseResponse:
        return pb.AfterResponseResponse()


class WaitsForTheAudit:
    """A tool that returns only once the audit hook has seen the turn's model output."""

    kind = pb.ToolKind.TOOL_KIND_SANDBOX

    def __init__(self, seen: asyncio.Event) -> None:
        self.seen = seen

    async def can_execute(self, tool: pb.Tool) -> bool:
        return tool.function.name == "lookup"

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: Any) -> pb.FunctionCallOutput:
        async with asyncio.timeout(10):
            await self.seen.wait()
        return pb.FunctionCallOutput(call_id=call.call_id, output="found")


async def test_an_observation_goes_on_its_own_before_the_run_waits_on_a_tool() -> None:
    hook = Audits()
    service = RecordingSession(hook)
    executors = [WaitsForTheAudit(hook.model_output_seen)]
    provider = lookup_then_answer()
    async with (
        hook_server(service) as target,
        running_gateway(provider=provider, executors=executors, hooks=[target]) as gw,
    ):
        response = final(await gw.stream(tools_request()))
    assert response.status == S.RESPONSE_STATUS_COMPLETED, "the audit saw the output while the tool ran"
    assert service.exchanges == [["after_model"], ["after_model", "after_response"]]


async def test_a_steering_message_during_the_tool_is_in_the_next_call_the_hook_is_asked_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("HOOK_RECORD", str(record))
    tool = GatedTool()
    service = RecordingSession(Recorder())
    provider = ScriptedProvider([[Call.of("slow", {}, call_id="c1")], [Text("Adjusted.")]])
    async with (
        hook_server(service) as target,
        running_gateway(provider=provider, executors=[FunctionExecutor(), tool], hooks=[target]) as gw,
    ):
        session = InteractiveSession(gw)
        request = user("go")
        request.tools.append(function_tool("slow"))
        await session.start(request)
        await session.until("tool_execution_in_progress")
        await tool.started.wait()
        await session.accepted(gw, steer("also check the logs"))
        tool.release.set()
        terminal = await session.until("terminal")
    assert terminal.completed.response.status == S.RESPONSE_STATUS_COMPLETED
    # The steering message was there before the call's result: nothing was asked ahead.
    assert ["after_tool"] in service.exchanges and ["pause_check", "before_model"] in service.exchanges
    asked = [s for s in read_record(str(record)) if s["point"] == "before_model"]
    assert [(s["turn"], s["items"]) for s in asked] == [(1, 1), (2, 4)], "turn 2 asked once, with the message"
