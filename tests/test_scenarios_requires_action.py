"""User story 3 (client-executed tools pause with requires_action) and the conversation edge
cases that continue such a response."""

from __future__ import annotations

import grpc
import pytest

from antwort_grpc import pb
from antwort_grpc.providers.base import TurnRequest
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text
from tests.fakes import MockExecutor, echo
from tests.harness import final, function_tool, kinds, output_kinds, output_text, running_gateway, user

S = pb.ResponseStatus


def weather() -> pb.CreateResponseRequest:
    request = user("Weather in Paris and Rome?")
    request.tools.append(function_tool("get_weather", city="string"))
    return request


def answer(call_id: str, output: str) -> pb.Item:
    return pb.Item(function_call_output=pb.FunctionCallOutput(call_id=call_id, output=output))


def follow_up(previous: str, *items: pb.Item) -> pb.CreateResponseRequest:
    request = pb.CreateResponseRequest(previous_response_id=previous)
    request.input_items.items.extend(items)
    request.tools.append(function_tool("get_weather", city="string"))
    return request


def kinds_sent(turn: TurnRequest) -> list[str]:
    return [i.WhichOneof("kind") or "" for i in turn.items]


async def test_function_call_without_server_executor_requires_action() -> None:
    provider = ScriptedProvider([[Call.of("get_weather", {"city": "Paris"}, call_id="c_paris")]])
    async with running_gateway(provider=provider, executors=[MockExecutor({"other_tool": echo})]) as gw:
        response = await gw.create(weather())
    assert response.status == S.RESPONSE_STATUS_REQUIRES_ACTION
    assert output_kinds(response) == ["function_call"]
    assert response.output[0].function_call.call_id == "c_paris"


async def test_streaming_requires_action_terminal_event_lists_the_calls() -> None:
    provider = ScriptedProvider(
        [
            [
                Call.of("get_weather", {"city": "Paris"}, call_id="c1"),
                Call.of("get_weather", {"city": "Rome"}, call_id="c2"),
            ]
        ]
    )
    async with running_gateway(provider=provider) as gw:
        events = await gw.stream(weather())
    names = kinds(events)
    assert names[-1] == "requires_action" and "completed" not in names
    assert names.count("function_call_arguments_done") == 2
    terminal = events[-1].requires_action
    assert terminal.response.status == S.RESPONSE_STATUS_REQUIRES_ACTION
    assert [c.call_id for c in terminal.tool_calls] == ["c1", "c2"]


async def test_follow_up_with_outputs_continues_the_conversation() -> None:
    provider = ScriptedProvider(
        [
            [Call.of("get_weather", {"city": "Paris"}, call_id="c1")],
            [Text("It is sunny in Paris.")],
        ]
    )
    async with running_gateway(provider=provider) as gw:
        first = await gw.create(weather())
        assert first.status == S.RESPONSE_STATUS_REQUIRES_ACTION
        events = await gw.stream(follow_up(first.id, answer("c1", '{"sky": "sunny"}')))
    second = final(events)
    assert second.status == S.RESPONSE_STATUS_COMPLETED
    assert second.previous_response_id == first.id
    assert output_text(second) == "It is sunny in Paris."
    # The model saw: the first input, the stored function_call, then the client's output.
    assert kinds_sent(provider.requests[1]) == ["message", "function_call", "function_call_output"]
    sent_call = provider.requests[1].items[1].function_call
    assert sent_call.call_id == "c1" and sent_call.name == "get_weather"


async def test_follow_up_without_outputs_is_sent_to_the_model_as_it_is() -> None:
    provider = ScriptedProvider([[Call.of("get_weather", {"city": "Paris"}, call_id="c1")], [Text("Let me retry.")]])
    async with running_gateway(provider=provider) as gw:
        first = await gw.create(weather())
        request = follow_up(
            first.id, pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[_text("never mind")]))
        )
        second = await gw.create(request)
    assert second.status == S.RESPONSE_STATUS_COMPLETED
    assert kinds_sent(provider.requests[1]) == ["message", "function_call", "message"]


async def test_mixed_turn_pauses_with_requires_action_and_runs_server_calls_on_continuation() -> None:
    provider = ScriptedProvider(
        [
            [
                Call.of("get_weather", {"city": "Paris"}, call_id="client_call"),
                Call.of("lookup", {"q": "x"}, call_id="srv"),
            ],
            [Text("Both answered.")],
        ]
    )
    executor = MockExecutor({"lookup": echo})
    async with running_gateway(provider=provider, executors=[executor]) as gw:
        request = weather()
        request.tools.append(function_tool("lookup", q="string"))
        first = await gw.create(request)
        assert first.status == S.RESPONSE_STATUS_REQUIRES_ACTION
        assert executor.calls == [], "a paused turn runs none of its server-side calls"
        follow = follow_up(first.id, answer("client_call", "22C"))
        follow.tools.append(function_tool("lookup", q="string"))
        events = await gw.stream(follow)
    second = final(events)
    assert [c.call_id for c in executor.calls] == ["srv"]
    assert output_kinds(second) == ["function_call_output", "message"]
    assert second.output[0].function_call_output.call_id == "srv"
    sent = provider.requests[1]
    answered = [i.function_call_output.call_id for i in sent.items if i.WhichOneof("kind") == "function_call_output"]
    assert sorted(answered) == ["client_call", "srv"]


async def test_executor_that_claims_nothing_leaves_calls_to_the_client() -> None:
    provider = ScriptedProvider([[Call.of("get_weather", {"city": "Paris"})]])
    async with running_gateway(provider=provider, executors=[MockExecutor({})]) as gw:
        response = await gw.create(weather())
    assert response.status == S.RESPONSE_STATUS_REQUIRES_ACTION


async def test_missing_previous_response_is_not_found() -> None:
    async with running_gateway(provider=ScriptedProvider([])) as gw:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await gw.create(follow_up("resp_does_not_exist", answer("c1", "x")))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "resp_does_not_exist" in (info.value.details() or "")


async def test_store_false_keeps_nothing_and_cannot_be_continued() -> None:
    provider = ScriptedProvider([[Call.of("get_weather", {"city": "Paris"}, call_id="c1")]])
    async with running_gateway(provider=provider) as gw:
        request = weather()
        request.store = False
        first = await gw.create(request)
        assert first.status == S.RESPONSE_STATUS_REQUIRES_ACTION and not first.store
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await gw.stub.GetResponse(pb.GetResponseRequest(response_id=first.id))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await gw.create(follow_up(first.id, answer("c1", "x")))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_conversation_chain_carries_every_earlier_turn() -> None:
    provider = ScriptedProvider([[Text("one")], [Text("two")], [Text("three")]])
    async with running_gateway(provider=provider) as gw:
        previous = ""
        for word in ("a", "b", "c"):
            request = user(word)
            request.previous_response_id = previous
            previous = (await gw.create(request)).id
    sent = provider.requests[2].items
    texts = [p.input_text.text or p.output_text.text for i in sent for p in i.message.content]
    assert texts == ["a", "one", "b", "two", "c"]


def _text(text: str) -> pb.ContentPart:
    return pb.ContentPart(input_text=pb.InputText(text=text))
