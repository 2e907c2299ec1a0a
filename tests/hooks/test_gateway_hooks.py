"""Hooks at every point, through a real gateway, with each hook service a process of its own
(`antwort-grpc hook run tests.hooks.hook_services:…`)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from antwort_grpc import pb
from antwort_grpc.grpc_status import DOMAIN
from antwort_grpc.providers.base import Provider, TurnRequest
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text
from tests.executors.remote_services import free_port, start_process, stop_process
from tests.fakes import MockExecutor, echo
from tests.harness import (
    GatewayClient,
    assert_valid_stream,
    collect,
    final,
    function_tool,
    kinds,
    output_kinds,
    running_gateway,
    user,
)
from tests.hooks.hook_services import read_record

S = pb.ResponseStatus
P = pb.HookPoint
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@asynccontextmanager
async def hooked_gateway(
    provider: Provider,
    *hooks: str,
    record: Path | None = None,
    executors: Any = None,
    **settings: Any,
) -> AsyncIterator[GatewayClient]:
    """Each hook `Class[;options]` from tests.hooks.hook_services as a process, and a gateway
    configured with them in that order."""
    async with AsyncExitStack() as stack:
        specs = []
        for hook in hooks:
            cls, _, options = hook.partition(";")
            env = {"HOOK_RECORD": str(record)} if record else {}
            child = await start_process(
                "hook", "run", f"tests.hooks.hook_services:{cls}", "--listen", "127.0.0.1:0", env=env
            )
            stack.push_async_callback(stop_process, child.proc)
            specs.append(child.target + (f";{options}" if options else ""))
        gw = await stack.enter_async_context(
            running_gateway(
                provider=provider, executors=executors or [MockExecutor({"lookup": echo})], hooks=specs, **settings
            )
        )
        yield gw


def reason_of(err: grpc.aio.AioRpcError) -> str:
    status = rpc_status.from_call(err)
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            assert info.domain == DOMAIN
            return info.reason
    return ""


def lookup_request(text: str = "Look it up", *names: str) -> pb.CreateResponseRequest:
    request = user(text)
    for name in names or ("lookup",):
        request.tools.append(function_tool(name, q="string"))
    return request


def outputs(request: TurnRequest) -> list[pb.FunctionCallOutput]:
    return [i.function_call_output for i in request.items if i.WhichOneof("kind") == "function_call_output"]


def two_turns(*calls: Call) -> ScriptedProvider:
    return ScriptedProvider([list(calls or [Call.of("lookup", {"q": "x"}, call_id="call_1")]), [Text("Done.")]])


async def test_every_point_is_called_in_order_with_the_callers_trace_context(tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    async with hooked_gateway(two_turns(), "Recorder", record=record) as gw:
        request = lookup_request()
        request.stream = True
        events = await collect(gw.stub.CreateResponse(request, metadata=(("traceparent", TRACEPARENT),)))
    assert_valid_stream(events)
    response = final(events)
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    seen = read_record(str(record))
    assert [(s["point"], s.get("turn", s.get("call", s.get("status")))) for s in seen] == [
        ("before_response", None),
        ("pause_check", 0),
        ("before_model", 1),
        ("after_model", 1),
        ("pause_check", 1),
        ("approve_tool", "lookup"),
        ("before_tool", "lookup"),
        ("after_tool", "lookup"),
        ("pause_check", 1),
        ("before_model", 2),
        ("after_model", 2),
        ("after_response", "RESPONSE_STATUS_COMPLETED"),
    ]
    assert [s["at"] for s in seen if s["point"] == "pause_check"] == [
        "CHECK_POINT_TURN_BOUNDARY",
        "CHECK_POINT_BEFORE_TOOLS",
        "CHECK_POINT_TURN_BOUNDARY",
    ]
    assert {s["traceparent"] for s in seen} == {TRACEPARENT}
    assert seen[-1]["response_id"] == response.id
    assert response.metrics.hook_calls == 12 and response.metrics.hook_failures == 0
    assert response.metrics.hook_time.ToNanoseconds() > 0


async def test_example_hook_denies_a_tool_by_name_and_redacts_e_mail_addresses() -> None:
    """examples/redact_hook.py, run as its own process as docs/hooks.md shows."""
    provider = ScriptedProvider(
        [
            [Call.of("lookup", {"q": "owner"}, call_id="call_1"), Call.of("delete_user", {"q": "bob"}, call_id="c2")],
            [Text("Done.")],
        ]
    )
    executor = MockExecutor({"lookup": lambda call: "owner: alice@example.com, cc bob.smith+x@mail.example.org"})
    executor.handlers["delete_user"] = echo
    child = await start_process("hook", "run", "examples.redact_hook:DenyAndRedact", "--listen", "127.0.0.1:0")
    try:
        async with running_gateway(provider=provider, executors=[executor], hooks=[child.target]) as gw:
            response = final(await gw.stream(lookup_request("Who owns it? Then delete bob.", "lookup", "delete_user")))
    finally:
        await stop_process(child.proc)
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    assert [c.name for c in executor.calls] == ["lookup"], "the denied tool never ran"
    lookup, delete = outputs(provider.requests[1])
    assert lookup.output == "owner: [redacted e-mail], cc [redacted e-mail]" and not lookup.is_error
    assert delete.is_error and "delete_user is not allowed here" in delete.output
    assert "@" not in json.dumps([i.function_call_output.output for i in response.output])


async def test_before_model_changes_the_call_and_before_tool_the_arguments() -> None:
    provider = two_turns(Call.of("lookup", {"q": 21}, call_id="call_1"))
    executor = MockExecutor({"lookup": echo})
    async with hooked_gateway(provider, "Rewrites", executors=[executor]) as gw:
        request = lookup_request()
        request.instructions = "Be brief."
        response = final(await gw.stream(request))
    first = provider.requests[0]
    assert first.instructions == "Be brief. (checked)" and first.temperature == 0.25
    assert first.items[-1].message.role == pb.Role.ROLE_DEVELOPER, "the hook's item is appended to the call"
    assert json.loads(executor.calls[0].arguments) == {"q": 42}, "the tool ran with the hook's arguments"
    assert outputs(provider.requests[1])[0].output.startswith("["), "after-tool changed the result"
    assert all(i.message.role != pb.Role.ROLE_DEVELOPER for i in response.output), "appended items are not stored"
    assert response.status == S.RESPONSE_STATUS_COMPLETED


@pytest.mark.parametrize("stream", [True, False])
async def test_before_model_answer_is_used_instead_of_calling_the_model(stream: bool) -> None:
    provider = ScriptedProvider([])
    async with hooked_gateway(provider, "Answers") as gw:
        response = final(await gw.stream(user("hi"))) if stream else await gw.create(user("hi"))
    assert provider.requests == [], "the model was never called"
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    assert response.output[0].message.content[0].output_text.text == "cached answer"
    assert response.metrics.model_calls == 0 and response.metrics.turn_metrics[0].answered_by_hook


async def test_before_response_rejects_with_permission_denied_before_anything_is_stored() -> None:
    provider = ScriptedProvider([[Text("Bonjour.")]])
    async with hooked_gateway(provider, "Rejects") as gw:
        request = user("hi")
        request.metadata["tier"] = "free"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await gw.stream(request)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED and reason_of(info.value) == "hook_rejected"
        assert "no budget left" in (info.value.details() or "")
        assert provider.requests == []
        allowed = final(await gw.stream(user("hi")))
    assert allowed.status == S.RESPONSE_STATUS_COMPLETED
    assert provider.requests[0].instructions == "Answer in French.", "the hook changed the request"
    assert allowed.instructions == "Answer in French."


async def test_pause_check_pauses_until_a_client_resumes() -> None:
    async with hooked_gateway(two_turns(), "Pauses") as gw:
        request = lookup_request()
        request.stream = True
        call = gw.stub.CreateResponse(request)
        events: list[pb.StreamEvent] = []
        async for message in call:
            events.append(message.event)
            if kinds(events)[-1] == "paused":
                resume = pb.Control(resume=pb.ResumeControl())
                rid = events[0].created.response.id
                await gw.stub.ControlResponse(pb.ControlResponseRequest(response_id=rid, control=resume))
    assert_valid_stream(events)
    names = kinds(events)
    assert names.count("paused") == 1 and names.index("resumed") == names.index("paused") + 1
    assert events[names.index("paused")].paused.reason == "review turn 1"
    assert final(events).status == S.RESPONSE_STATUS_COMPLETED


async def test_approve_tool_hook_denies_and_approves_on_the_approval_path() -> None:
    provider = two_turns(Call.of("rm", {"q": "/"}, call_id="c_rm"), Call.of("lookup", {"q": "x"}, call_id="c_ok"))
    executor = MockExecutor({"lookup": echo, "rm": echo})
    request = lookup_request("Clean up", "rm", "lookup")
    for tool in request.tools:
        tool.require_approval.mode = pb.ApprovalMode.APPROVAL_MODE_ALWAYS
    async with hooked_gateway(provider, "Gatekeeper", executors=[executor]) as gw:
        response = await gw.create(request)
    assert response.status == S.RESPONSE_STATUS_COMPLETED, "no client had to decide"
    assert [c.name for c in executor.calls] == ["lookup"]
    rm, ok = outputs(provider.requests[1])
    assert rm.is_error and rm.output.startswith("denied by a policy hook: ")
    assert "destructive" in rm.output and not ok.is_error
    # The model sees the reason, never where the hook runs.
    assert "127.0.0.1" not in rm.output and "gatekeeper" not in rm.output


# -- failures ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", ["Hangs", "Crashes", "Garbage"])
async def test_failing_hook_fail_open_continues_and_says_so(cls: str) -> None:
    async with hooked_gateway(two_turns(), f"{cls};failure=open;timeout=0.5") as gw:
        events = await gw.stream(lookup_request())
    response = final(events)
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    failed = [e.hook_failed for e in events if e.WhichOneof("event") == "hook_failed"]
    assert [f.point for f in failed] == [P.HOOK_POINT_BEFORE_MODEL, P.HOOK_POINT_BEFORE_TOOL, P.HOOK_POINT_BEFORE_MODEL]
    assert failed[1].call_id == "call_1" and failed[0].hook.startswith(cls.lower())
    assert not response.output[1].function_call_output.is_error, "the tool ran as if the hook had no objection"
    assert response.metrics.hook_failures == 3


async def test_failing_hook_fail_closed_fails_the_response_at_a_model_point() -> None:
    async with hooked_gateway(two_turns(), "Crashes;failure=closed") as gw:
        response = final(await gw.stream(lookup_request()))
    assert response.status == S.RESPONSE_STATUS_FAILED
    assert response.error.code == "hook_failed" and "the rules file is gone" in response.error.message


async def test_failing_hook_fail_closed_denies_the_tool_call() -> None:
    provider = two_turns()
    executor = MockExecutor({"lookup": echo})
    async with hooked_gateway(provider, "ToolOnlyCrash;failure=closed", executors=[executor]) as gw:
        response = final(await gw.stream(lookup_request()))
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    output = outputs(provider.requests[1])[0]
    assert output.is_error and output.output.startswith("denied: hook tool-only-crash")
    assert "policy engine down" in output.output
    assert executor.calls == [], "the call never ran"


async def test_hook_service_that_is_not_there_gets_its_failure_policy() -> None:
    target = f"127.0.0.1:{free_port()}"
    provider = ScriptedProvider([[Text("Hi.")]])
    async with running_gateway(provider=provider, hooks=[f"{target};failure=closed;timeout=0.5"]) as gw:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await gw.stream(user("hi"))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert reason_of(info.value) == "hook_failed"
    async with running_gateway(provider=provider, hooks=[f"{target};failure=open;timeout=0.5"]) as gw:
        events = await gw.stream(user("hi"))
    assert final(events).status == S.RESPONSE_STATUS_COMPLETED
    points = {e.hook_failed.point for e in events if e.WhichOneof("event") == "hook_failed"}
    assert P.HOOK_POINT_BEFORE_RESPONSE in points and P.HOOK_POINT_AFTER_RESPONSE in points


async def test_audit_hook_fail_closed_fails_the_response_it_could_not_record() -> None:
    async with hooked_gateway(ScriptedProvider([[Text("Hi.")]]), "AuditDown;failure=closed") as gw:
        response = final(await gw.stream(user("hi")))
        stored = await gw.store.get(response.id)
    assert response.status == S.RESPONSE_STATUS_FAILED and response.error.code == "hook_failed"
    assert "audit log unavailable" in response.error.message
    assert stored is not None and stored.response.status == S.RESPONSE_STATUS_FAILED
    assert output_kinds(response) == ["message"], "the output is kept"
