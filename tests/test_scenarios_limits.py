"""User stories 4 and 5: allowed tools, the turn limit, cancellation, deadlines, provider errors."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from antwort_grpc import pb
from antwort_grpc.providers.base import ProviderError, TurnRequest
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text, Turn
from antwort_grpc.storage.memory import MemoryStore
from tests.fakes import MockExecutor, echo
from tests.harness import assert_valid_stream, collect, final, function_tool, kinds, output_kinds, running_gateway, user

S = pb.ResponseStatus


def abc_request(allowed: list[str] | None) -> pb.CreateResponseRequest:
    request = user("use a tool")
    for name in ("A", "B", "C"):
        request.tools.append(function_tool(name, q="string"))
    if allowed is not None:
        request.tool_choice.allowed_tools.tool_names.extend(allowed)
    return request


def outputs_sent(turn: TurnRequest) -> list[pb.FunctionCallOutput]:
    return [i.function_call_output for i in turn.items if i.WhichOneof("kind") == "function_call_output"]


async def test_allowed_tool_is_executed_normally() -> None:
    executor = MockExecutor({"A": echo, "B": echo, "C": echo})
    provider = ScriptedProvider([[Call.of("A", {"q": "1"})], [Text("done")]])
    async with running_gateway(provider=provider, executors=[executor]) as gw:
        response = final(await gw.stream(abc_request(["A"])))
    assert [c.name for c in executor.calls] == ["A"]
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    assert [t.name for t in provider.requests[0].tools] == ["A", "B", "C"], "the model still sees every tool"


async def test_disallowed_tool_is_not_executed_and_an_error_is_fed_back() -> None:
    executor = MockExecutor({"A": echo, "B": echo, "C": echo})
    provider = ScriptedProvider([[Call.of("B", {"q": "1"}, call_id="cb")], [Text("B is not allowed.")]])
    async with running_gateway(provider=provider, executors=[executor]) as gw:
        response = final(await gw.stream(abc_request(["A"])))
    assert executor.calls == []
    fed_back = outputs_sent(provider.requests[1])
    assert len(fed_back) == 1 and fed_back[0].call_id == "cb" and fed_back[0].is_error
    assert "not allowed" in fed_back[0].output
    assert response.status == S.RESPONSE_STATUS_COMPLETED


async def test_disallowed_client_tool_is_never_handed_to_the_client() -> None:
    provider = ScriptedProvider([[Call.of("B", {"q": "1"}, call_id="cb")], [Text("ok")]])
    async with running_gateway(provider=provider) as gw:
        response = final(await gw.stream(abc_request(["A"])))
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    assert output_kinds(response) == ["function_call", "function_call_output", "message"]
    assert response.output[1].function_call_output.is_error


async def test_without_allowed_tools_every_tool_is_allowed() -> None:
    executor = MockExecutor({"A": echo, "B": echo, "C": echo})
    provider = ScriptedProvider([[Call.of("A", {}), Call.of("B", {}), Call.of("C", {})], [Text("done")]], repeat=True)
    async with running_gateway(provider=provider, executors=[executor]) as gw:
        for allowed in (None, []):
            response = final(await gw.stream(abc_request(allowed)))
            assert not any(i.function_call_output.is_error for i in response.output)
    assert [c.name for c in executor.calls] == ["A", "B", "C", "A", "B", "C"]


async def test_call_to_a_tool_not_in_the_request_is_fed_back_as_an_error() -> None:
    provider = ScriptedProvider([[Call.of("made_up", {}, call_id="cx")], [Text("sorry")]])
    async with running_gateway(provider=provider, executors=[MockExecutor({"A": echo})]) as gw:
        response = final(await gw.stream(abc_request(None)))
    error = response.output[1].function_call_output
    assert error.call_id == "cx" and error.is_error and "not defined" in error.output
    assert response.status == S.RESPONSE_STATUS_COMPLETED


async def test_turn_limit_ends_incomplete_with_results_so_far() -> None:
    provider = ScriptedProvider([[Call.of("A", {"q": "again"})]], repeat=True)
    async with running_gateway(provider=provider, executors=[MockExecutor({"A": echo})], max_turns=2) as gw:
        events = await gw.stream(abc_request(None))
    response = final(events)
    assert kinds(events)[-1] == "incomplete"
    assert response.status == S.RESPONSE_STATUS_INCOMPLETE
    assert response.incomplete_details.reason == "max_turns"
    assert output_kinds(response) == ["function_call", "function_call_output"] * 2
    assert len(provider.requests) == 2


async def test_cancel_mid_turn_ends_with_cancelled_and_is_stored() -> None:
    provider = ScriptedProvider([Turn([Text("word " * 50)], delay=0.05)])
    store = MemoryStore()
    async with running_gateway(provider=provider, store=store) as gw:
        request = user("talk slowly")
        request.stream = True
        call = gw.stub.CreateResponse(request)
        events: list[pb.StreamEvent] = []
        async for message in call:
            events.append(message.event)
            if kinds(events).count("output_text_delta") == 3:
                response_id = events[0].created.response.id
                cancelled = await gw.stub.CancelResponse(pb.CancelResponseRequest(response_id=response_id))
                assert cancelled.response.status == S.RESPONSE_STATUS_CANCELLED
    assert_valid_stream(events)
    assert kinds(events)[-1] == "cancelled"
    stored = await store.get(response_id)
    assert stored is not None and stored.response.status == S.RESPONSE_STATUS_CANCELLED
    assert stored.response.output[0].status == pb.ItemStatus.ITEM_STATUS_INCOMPLETE
    assert stored.response.output[0].message.content[0].output_text.text.startswith("word word word")


async def test_cancel_during_tool_execution_stops_the_tools() -> None:
    executor = MockExecutor({"A": echo}, delay=30)
    provider = ScriptedProvider([[Call.of("A", {})], [Text("never")]])
    async with running_gateway(provider=provider, executors=[executor]) as gw:
        request = abc_request(None)
        request.stream = True
        call = gw.stub.CreateResponse(request)
        events = []
        async for message in call:
            events.append(message.event)
            if kinds(events)[-1] == "tool_execution_in_progress":
                await executor.started.wait()
                await gw.stub.CancelResponse(pb.CancelResponseRequest(response_id=events[0].created.response.id))
    assert_valid_stream(events)
    assert kinds(events)[-1] == "cancelled"
    assert executor.running == 0, "the running tool was cancelled"


async def test_client_disconnect_is_stored_as_cancelled() -> None:
    provider = ScriptedProvider([Turn([Text("word " * 200)], delay=0.02)])
    store = MemoryStore()
    async with running_gateway(provider=provider, store=store) as gw:
        request = user("talk")
        request.stream = True
        call = gw.stub.CreateResponse(request)
        first = (await call.read()).event
        await call.read()
        call.cancel()
        response_id = first.created.response.id
        for _ in range(200):
            stored = await store.get(response_id)
            if stored and stored.response.status == S.RESPONSE_STATUS_CANCELLED:
                break
            await asyncio.sleep(0.01)
    assert stored is not None and stored.response.status == S.RESPONSE_STATUS_CANCELLED


async def test_provider_error_in_an_intermediate_turn_fails_with_its_code() -> None:
    provider = ScriptedProvider(
        [[Call.of("A", {})], Turn(error=ProviderError("backend_unavailable", "the model server is down"))]
    )
    async with running_gateway(provider=provider, executors=[MockExecutor({"A": echo})]) as gw:
        events = await gw.stream(abc_request(None))
    response = final(events)
    assert kinds(events)[-1] == "failed"
    assert response.status == S.RESPONSE_STATUS_FAILED
    assert response.error.code == "backend_unavailable"
    assert response.error.message == "the model server is down"
    assert output_kinds(response) == ["function_call", "function_call_output"], "the first turn's work is kept"


async def test_provider_error_mid_stream_keeps_the_partial_output() -> None:
    provider = ScriptedProvider(
        [Turn([Text("partial answer that breaks")], error=ProviderError("backend_unavailable", "cut"), error_after=2)]
    )
    store = MemoryStore()
    async with running_gateway(provider=provider, store=store) as gw:
        events = await gw.stream(user("hi"))
    response = final(events)
    assert response.status == S.RESPONSE_STATUS_FAILED
    assert response.output[0].status == pb.ItemStatus.ITEM_STATUS_INCOMPLETE
    assert response.output[0].message.content[0].output_text.text == "partial answer"
    stored = await store.get(response.id)
    assert stored is not None and stored.response.output[0].message.content[0].output_text.text == "partial answer"


async def test_deadline_ends_the_response_failed_before_the_client_gives_up() -> None:
    provider = ScriptedProvider([Turn([Text("slow " * 100)], delay=0.5)])
    store = MemoryStore()
    async with running_gateway(provider=provider, store=store) as gw:
        request = user("slow please")
        request.stream = True
        events = await collect(gw.stub.CreateResponse(request, timeout=1.5))
    assert_valid_stream(events)
    response = final(events)
    assert response.status == S.RESPONSE_STATUS_FAILED
    assert response.error.code == "deadline_exceeded"


async def test_length_finish_is_incomplete_with_max_output_tokens() -> None:
    from antwort_grpc.providers.base import FinishReason

    provider = ScriptedProvider([Turn([Text("cut off")], finish=FinishReason.LENGTH)], repeat=True)
    async with running_gateway(provider=provider) as gw:
        streamed = final(await gw.stream(user("long story")))
        non_streamed = await gw.create(user("long story"))
    for r in (streamed, non_streamed):
        assert r.status == S.RESPONSE_STATUS_INCOMPLETE
        assert r.incomplete_details.reason == "max_output_tokens"


@pytest.mark.parametrize("stream", [True, False])
async def test_usage_is_summed_over_all_turns(stream: bool) -> None:
    usage = [pb.Usage(input_tokens=100 * n, output_tokens=n, total_tokens=101 * n) for n in (1, 2, 3)]
    provider = ScriptedProvider(
        [
            Turn([Call.of("A", {})], usage=usage[0]),
            Turn([Call.of("A", {})], usage=usage[1]),
            Turn([Text("done")], usage=usage[2]),
        ]
    )
    async with running_gateway(provider=provider, executors=[MockExecutor({"A": echo})]) as gw:
        request = abc_request(None)
        response = final(await gw.stream(request)) if stream else await gw.create(request)
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (600, 6, 606)


async def test_unknown_model_default_is_invalid_argument() -> None:
    async with running_gateway(provider=ScriptedProvider([]), model="") as gw:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await gw.create(user("hi"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "model" in (info.value.details() or "")
