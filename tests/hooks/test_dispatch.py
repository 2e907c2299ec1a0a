"""The dispatcher against real hook services (separate processes) and in-process hooks: what each
point applies, the order of hooks, and every way a hook can fail under both failure policies."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from antwort_grpc import pb
from antwort_grpc.hooks import Caller, Dispatcher, HookFailed, HookRejected, HookRun, LocalHook, RemoteHook, build_hooks
from antwort_grpc.hooks.clients import parse_spec
from antwort_grpc.hooks.service import PolicyHook
from tests.executors.remote_services import free_port, start_process, stop_process
from tests.hooks.hook_services import Answers, Gatekeeper, Pauses, Recorder, Rewrites, read_record

P = pb.HookPoint
CALL = pb.FunctionCall(call_id="call_1", name="add", arguments='{"a": 1, "b": 2}')
TOOL = pb.Tool(function=pb.FunctionTool(name="add"))
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def new_run() -> HookRun:
    return HookRun(Caller(owner="alice", traceparent=TRACEPARENT), pb.HookContext(response_id="resp_1", turn=1))


@asynccontextmanager
async def hook_process(cls: str, record: Path | None = None) -> AsyncIterator[str]:
    env = {"HOOK_RECORD": str(record)} if record else {}
    child = await start_process("hook", "run", f"tests.hooks.hook_services:{cls}", "--listen", "127.0.0.1:0", env=env)
    try:
        yield child.target
    finally:
        await stop_process(child.proc)


@asynccontextmanager
async def remote(target: str, *, fail_open: bool, timeout: float = 2.0) -> AsyncIterator[Dispatcher]:
    dispatcher = Dispatcher([RemoteHook(target, timeout, fail_open)])
    await dispatcher.start()
    try:
        yield dispatcher
    finally:
        await dispatcher.close()


async def test_remote_hook_is_called_only_at_the_points_it_wants(tmp_path: Path) -> None:
    async with hook_process("Crashes") as target, remote(target, fail_open=False) as hooks:
        assert hooks.wants(P.HOOK_POINT_BEFORE_TOOL) and hooks.wants(P.HOOK_POINT_BEFORE_MODEL)
        assert not hooks.wants(P.HOOK_POINT_AFTER_TOOL) and not hooks.wants(P.HOOK_POINT_PAUSE_CHECK)


async def test_traceparent_and_owner_travel_in_the_metadata(tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    async with hook_process("Recorder", record) as target, remote(target, fail_open=False) as hooks:
        decision = await hooks.before_tool(new_run(), CALL, TOOL)
    assert decision.result is None and decision.call == CALL
    [seen] = read_record(str(record))
    assert seen == {
        "point": "before_tool",
        "traceparent": TRACEPARENT,
        "owner": "alice",
        "call": "add",
        "arguments": CALL.arguments,
    }


@pytest.mark.parametrize("cls", ["Hangs", "Crashes", "Garbage"])
async def test_failing_hook_fail_open_lets_the_call_run_and_reports_the_failure(cls: str) -> None:
    run = new_run()
    async with hook_process(cls) as target, remote(target, fail_open=True, timeout=0.5) as hooks:
        decision = await hooks.before_tool(run, CALL, TOOL)
    assert decision.result is None and decision.call == CALL
    [failure] = run.take_failures()
    assert failure.point == P.HOOK_POINT_BEFORE_TOOL and failure.call_id == "call_1"
    assert {"Hangs": "no answer within 0.5s", "Crashes": "the rules file is gone", "Garbage": "not JSON"}[cls] in (
        failure.error
    )
    assert run.failed == 1 and run.calls == 1


@pytest.mark.parametrize("cls", ["Hangs", "Crashes", "Garbage"])
async def test_failing_hook_fail_closed_denies_the_tool_call(cls: str) -> None:
    run = new_run()
    async with hook_process(cls) as target, remote(target, fail_open=False, timeout=0.5) as hooks:
        decision = await hooks.before_tool(run, CALL, TOOL)
        with pytest.raises(HookFailed) as failed:
            await hooks.before_model(run, pb.ModelCall(instructions="x"))
    assert decision.result is not None and decision.result.is_error
    assert decision.result.call_id == "call_1" and decision.result.output.startswith("denied: hook ")
    assert failed.value.failure.point == P.HOOK_POINT_BEFORE_MODEL
    assert run.take_failures() == [], "fail-closed failures are not reported as fail-open ones"


async def test_hook_service_that_is_not_there_gets_its_failure_policy() -> None:
    target = f"127.0.0.1:{free_port()}"
    closed, opened = RemoteHook(target, 0.5, fail_open=False), RemoteHook(target, 0.5, fail_open=True)
    hooks = Dispatcher([closed, opened])
    await hooks.start()
    try:
        assert hooks.wants(P.HOOK_POINT_AFTER_TOOL), "unknown points: every point, so the policy applies"
        run = new_run()
        result = await hooks.after_tool(run, CALL, pb.FunctionCallOutput(call_id="call_1", output="secret"))
        assert result.is_error and "withheld" in result.output and "secret" not in result.output
        open_only = Dispatcher([opened])
        await open_only.pause_check(run)
        assert [f.point for f in run.take_failures()] == [P.HOOK_POINT_PAUSE_CHECK]
    finally:
        await hooks.close()


async def test_hook_service_that_comes_up_later_is_used_then() -> None:
    port = free_port()
    hook = RemoteHook(f"127.0.0.1:{port}", 2.0, fail_open=False, retry_interval=0.05)
    hooks = Dispatcher([hook])
    await hooks.start()
    try:
        assert hooks.wants(P.HOOK_POINT_PAUSE_CHECK), "not known yet: every point"
        listen = f"127.0.0.1:{port}"
        child = await start_process("hook", "run", "tests.hooks.hook_services:Rewrites", "--listen", listen)
        try:
            await hook.known.wait()
            decision = await hooks.before_tool(new_run(), CALL, TOOL)
        finally:
            await stop_process(child.proc)
        assert json.loads(decision.call.arguments) == {"a": 2, "b": 4}
        assert not hooks.wants(P.HOOK_POINT_PAUSE_CHECK), "its points are known now"
    finally:
        await hooks.close()


# -- in-process hooks: the points' semantics --------------------------------------------------------


def local(*hooks: PolicyHook, fail_open: bool = False) -> Dispatcher:
    return Dispatcher([LocalHook(h, 1.0, fail_open) for h in hooks])


async def test_hooks_run_in_order_and_each_sees_the_previous_change() -> None:
    call = pb.ModelCall(instructions="answer", tools=[pb.FunctionTool(name="add")])
    decision = await local(Rewrites(), Rewrites()).before_model(new_run(), call)
    assert decision.answer is None
    assert decision.call.instructions == "answer (checked) (checked)"
    assert decision.call.temperature == 0.25
    assert [i.message.role for i in decision.call.items] == [pb.Role.ROLE_DEVELOPER] * 2
    tool = await local(Rewrites(), Rewrites()).before_tool(new_run(), CALL, TOOL)
    assert json.loads(tool.call.arguments) == {"a": 4, "b": 8}
    result = await local(Rewrites(), Rewrites()).after_tool(new_run(), CALL, pb.FunctionCallOutput(output="3"))
    assert result.output == "[[3]]" and result.call_id == "call_1"


async def test_before_model_answer_replaces_the_model_call_as_an_assistant_message() -> None:
    decision = await local(Answers(), Rewrites()).before_model(new_run(), pb.ModelCall())
    assert decision.answer is not None
    [item] = decision.answer
    assert item.message.role == pb.Role.ROLE_ASSISTANT and item.message.content[0].output_text.text == "cached answer"


async def test_approval_deny_wins_over_an_earlier_approve() -> None:
    hooks = local(Gatekeeper(), Gatekeeper())
    rm = pb.FunctionCall(call_id="c", name="rm")
    approval = await hooks.approve_tool(new_run(), rm, TOOL)
    assert approval is not None and not approval.approved and approval.reason == "destructive"
    approval = await hooks.approve_tool(new_run(), CALL, TOOL)
    assert approval is not None and approval.approved
    assert await local(Recorder()).approve_tool(new_run(), CALL, TOOL) is None, "no opinion"


async def test_before_response_reject_and_replace() -> None:
    request = pb.CreateResponseRequest(input_text="hi", stream=True)

    class Rejects(PolicyHook):
        async def before_response(self, request: pb.BeforeResponseRequest) -> pb.BeforeResponseResponse:
            return pb.BeforeResponseResponse(reject_reason="no budget left")

    with pytest.raises(HookRejected) as rejected:
        await local(Rejects()).before_response(new_run(), request, lambda r: [])
    assert rejected.value.reason == "no budget left" and rejected.value.hook == "hook"

    class Replaces(PolicyHook):
        async def before_response(self, request: pb.BeforeResponseRequest) -> pb.BeforeResponseResponse:
            return pb.BeforeResponseResponse(request=pb.CreateResponseRequest(input_text="hello", stream=False))

    replaced = await local(Replaces()).before_response(new_run(), request, lambda r: [])
    assert replaced.input_text == "hello" and replaced.stream, "the transport's stream flag is kept"
    with pytest.raises(HookFailed) as failed:
        await local(Replaces()).before_response(new_run(), request, lambda r: ["input: bad"])
    assert "invalid: input: bad" in failed.value.failure.error


async def test_pause_check_gives_the_hooks_reason() -> None:
    run = new_run()
    run.context.turn = 2
    assert await local(Pauses()).pause_check(run) is None
    run.context.turn = 1
    assert await local(Pauses()).pause_check(run, before_tools=True) is None
    assert await local(Pauses()).pause_check(run) == "review turn 1"


async def test_hook_answering_the_wrong_message_type_is_garbage() -> None:
    class Confused(PolicyHook):
        async def before_tool(self, request: pb.BeforeToolRequest) -> pb.BeforeToolResponse:
            return pb.AfterToolResponse()  # type: ignore[return-value]

    run = new_run()
    decision = await local(Confused(), fail_open=True).before_tool(run, CALL, TOOL)
    assert decision.result is None
    assert "answered a AfterToolResponse" in run.take_failures()[0].error


def test_hook_specs() -> None:
    assert parse_spec("127.0.0.1:50071", 1.0, False) == parse_spec("127.0.0.1:50071", 1.0, False)
    spec = parse_spec("127.0.0.1:50071;timeout=0.25;failure=open", 1.0, False)
    assert (spec.target, spec.timeout, spec.fail_open, spec.in_process) == ("127.0.0.1:50071", 0.25, True, False)
    assert parse_spec("examples.redact_hook:DenyAndRedact", 1.0, False).in_process
    assert not parse_spec("dns:hooks", 1.0, False).in_process
    assert not parse_spec("dns:///hooks.default.svc:50071", 1.0, False).in_process
    for bad in ["", "x:1;timeout=-1", "x:1;timeout=abc", "x:1;failure=maybe", "x:1;retries=3"]:
        with pytest.raises(ValueError):
            parse_spec(bad, 1.0, False)


async def test_build_hooks_loads_in_process_classes_and_remote_targets() -> None:
    hooks = build_hooks(["tests.hooks.hook_services:Rewrites;failure=open", "127.0.0.1:1;timeout=2"], 1.0, False)
    assert isinstance(hooks[0], LocalHook) and hooks[0].fail_open and hooks[0].name == "rewrites"
    assert isinstance(hooks[1], RemoteHook) and hooks[1].timeout == 2.0 and not hooks[1].fail_open
    with pytest.raises(ValueError, match="not a PolicyHook"):
        build_hooks(["tests.hooks.test_dispatch:new_run"], 1.0, False)
    with pytest.raises(ValueError, match="cannot load"):
        build_hooks(["tests.hooks.nowhere:Hook"], 1.0, False)
