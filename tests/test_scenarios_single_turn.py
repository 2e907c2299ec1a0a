"""User story 1: single-turn function tool calls (single-shot behaviour without executors)."""

from __future__ import annotations

from antwort_grpc import pb
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text
from tests.harness import final, function_tool, output_kinds, running_gateway, user

S = pb.ResponseStatus


def weather_request(**choice: int) -> pb.CreateResponseRequest:
    request = user("What's the weather in Paris?")
    request.tools.append(function_tool("get_weather", city="string"))
    if "mode" in choice:
        request.tool_choice.mode = choice["mode"]  # type: ignore[assignment]
    return request


async def test_engine_without_executors_returns_function_calls_completed() -> None:
    provider = ScriptedProvider([[Call.of("get_weather", {"city": "Paris"})]])
    async with running_gateway(provider=provider, executors=[]) as gw:
        events = await gw.stream(weather_request())
    response = final(events)
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    assert output_kinds(response) == ["function_call"]
    assert response.output[0].function_call.name == "get_weather"
    assert len(provider.requests) == 1


async def test_tool_choice_none_sends_tools_but_never_runs_the_loop() -> None:
    provider = ScriptedProvider([[Text("I would call it."), Call.of("get_weather", {"city": "Paris"})]])
    async with running_gateway(provider=provider) as gw:
        events = await gw.stream(weather_request(mode=pb.ToolChoiceMode.TOOL_CHOICE_MODE_NONE))
    response = final(events)
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    assert output_kinds(response) == ["message", "function_call"]
    sent = provider.requests[0]
    assert [t.name for t in sent.tools] == ["get_weather"]
    assert sent.tool_choice is not None and sent.tool_choice.mode == pb.ToolChoiceMode.TOOL_CHOICE_MODE_NONE
    assert len(provider.requests) == 1


async def test_tool_choice_required_without_calls_is_respected() -> None:
    provider = ScriptedProvider([[Text("No tool needed: it is sunny.")]])
    async with running_gateway(provider=provider) as gw:
        events = await gw.stream(weather_request(mode=pb.ToolChoiceMode.TOOL_CHOICE_MODE_REQUIRED))
    response = final(events)
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    assert output_kinds(response) == ["message"]
    assert provider.requests[0].tool_choice is not None
    assert provider.requests[0].tool_choice.mode == pb.ToolChoiceMode.TOOL_CHOICE_MODE_REQUIRED
