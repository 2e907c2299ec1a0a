"""User story 2: the multi-turn agentic loop with server-side execution."""

from __future__ import annotations

import asyncio
import json

from antwort_grpc import pb
from antwort_grpc.providers.base import TurnRequest
from antwort_grpc.providers.scripted import Call, Reasoning, ScriptedProvider, Text
from tests.fakes import MockExecutor, echo, fails
from tests.harness import final, function_tool, kinds, output_kinds, output_text, running_gateway, user

S = pb.ResponseStatus


def tool_outputs(request: TurnRequest) -> list[pb.FunctionCallOutput]:
    return [i.function_call_output for i in request.items if i.WhichOneof("kind") == "function_call_output"]


def with_tools(text: str, *names: str) -> pb.CreateResponseRequest:
    request = user(text)
    for name in names:
        request.tools.append(function_tool(name, q="string"))
    return request


async def test_server_side_tool_call_is_executed_and_fed_back() -> None:
    provider = ScriptedProvider(
        [
            [Call.of("lookup", {"q": "antwort"}, call_id="call_1")],
            lambda turn: [Text(f"The tool said {tool_outputs(turn)[0].output}")],
        ]
    )
    executor = MockExecutor({"lookup": echo})
    async with running_gateway(provider=provider, executors=[executor]) as gw:
        events = await gw.stream(with_tools("Look it up", "lookup"))
    response = final(events)
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    assert output_kinds(response) == ["function_call", "function_call_output", "message"]
    assert [c.call_id for c in executor.calls] == ["call_1"]
    fed_back = tool_outputs(provider.requests[1])
    assert fed_back[0].call_id == "call_1" and not fed_back[0].is_error
    assert json.loads(fed_back[0].output) == {"tool": "lookup", "arguments": {"q": "antwort"}}
    assert response.output[1].function_call_output.call_id == "call_1"
    assert output_text(response).startswith("The tool said")


async def test_three_turn_loop_is_one_continuous_stream() -> None:
    provider = ScriptedProvider(
        [
            [Call.of("step_a", {"q": "1"})],
            [Text("Now B."), Call.of("step_b", {"q": "2"})],
            [Text("All done.")],
        ]
    )
    executor = MockExecutor({"step_a": echo, "step_b": echo})
    async with running_gateway(provider=provider, executors=[executor]) as gw:
        events = await gw.stream(with_tools("Do A then B", "step_a", "step_b"))
    names = kinds(events)
    assert names.count("created") == 1 and names.count("in_progress") == 1
    assert names.count("completed") == 1 and names[-1] == "completed"
    response = final(events)
    assert output_kinds(response) == [
        "function_call",
        "function_call_output",
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert provider.modes == ["stream", "stream", "stream"]
    assert response.usage.input_tokens == 30 and response.usage.output_tokens == 15
    assert response.usage.total_tokens == 45


async def test_parallel_calls_run_concurrently_and_are_fed_back_together() -> None:
    provider = ScriptedProvider(
        [
            [Call.of("slow", {"q": str(n)}, call_id=f"call_{n}") for n in range(3)],
            [Text("Three results.")],
        ]
    )
    executor = MockExecutor({"slow": echo}, delay=0.3)
    async with running_gateway(provider=provider, executors=[executor]) as gw:
        events = await gw.stream(with_tools("Three at once", "slow"))
    # All three were running at once (one after another, it would be 1): counted, not timed.
    assert executor.max_running == 3
    fed_back = tool_outputs(provider.requests[1])
    assert [o.call_id for o in fed_back] == ["call_0", "call_1", "call_2"]
    assert final(events).status == S.RESPONSE_STATUS_COMPLETED


async def test_results_go_back_in_the_models_order_not_the_finishing_order() -> None:
    delays = {"first": 0.2, "second": 0.0}

    class Staggered(MockExecutor):
        async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: object) -> pb.FunctionCallOutput:
            await asyncio.sleep(delays[json.loads(call.arguments)["q"]])
            return pb.FunctionCallOutput(call_id=call.call_id, output=call.arguments)

    provider = ScriptedProvider(
        [
            [Call.of("t", {"q": "first"}, call_id="c1"), Call.of("t", {"q": "second"}, call_id="c2")],
            [Text("ok")],
        ]
    )
    async with running_gateway(provider=provider, executors=[Staggered({"t": echo})]) as gw:
        events = await gw.stream(with_tools("go", "t"))
    response = final(events)
    outputs = [
        i.function_call_output.call_id for i in response.output if i.WhichOneof("kind") == "function_call_output"
    ]
    assert outputs == ["c1", "c2"]
    finished = [getattr(e, kinds([e])[0]).call_id for e in events if kinds([e])[0] == "tool_execution_completed"]
    assert finished == ["c2", "c1"], "the second call finishes first; the output order is still the model's"


async def test_tool_error_is_fed_back_as_is_error_output() -> None:
    provider = ScriptedProvider(
        [
            [Call.of("flaky", {"q": "x"}, call_id="call_err")],
            lambda turn: [Text("Sorry, the tool failed." if tool_outputs(turn)[0].is_error else "??")],
        ]
    )
    async with running_gateway(provider=provider, executors=[MockExecutor({"flaky": fails})]) as gw:
        events = await gw.stream(with_tools("Try it", "flaky"))
    response = final(events)
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    error = response.output[1].function_call_output
    assert error.is_error and "flaky exploded" in error.output
    assert "tool_execution_failed" in kinds(events)
    assert output_text(response) == "Sorry, the tool failed."


async def test_all_calls_failing_does_not_end_the_loop() -> None:
    provider = ScriptedProvider(
        [
            [Call.of("flaky", {"q": "1"}), Call.of("flaky", {"q": "2"})],
            [Call.of("flaky", {"q": "3"})],
            [Text("I give up.")],
        ]
    )
    async with running_gateway(provider=provider, executors=[MockExecutor({"flaky": fails})]) as gw:
        response = final(await gw.stream(with_tools("Try hard", "flaky")))
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    errors = [
        i.function_call_output.is_error for i in response.output if i.WhichOneof("kind") == "function_call_output"
    ]
    assert errors == [True, True, True]
    assert len(provider.requests) == 3


async def test_text_and_tool_calls_in_the_same_turn_are_both_kept() -> None:
    provider = ScriptedProvider([[Text("Let me check."), Call.of("lookup", {"q": "a"})], [Text("Found it.")]])
    async with running_gateway(provider=provider, executors=[MockExecutor({"lookup": echo})]) as gw:
        response = final(await gw.stream(with_tools("Check", "lookup")))
    assert output_kinds(response) == ["message", "function_call", "function_call_output", "message"]
    assert output_text(response) == "Let me check.Found it."


async def test_tool_progress_is_streamed_between_the_call_and_its_output() -> None:
    provider = ScriptedProvider([[Call.of("lookup", {"q": "a"})], [Text("ok")]])
    executor = MockExecutor({"lookup": echo}, progress_messages=["connecting", "reading"])
    async with running_gateway(provider=provider, executors=[executor]) as gw:
        events = await gw.stream(with_tools("Check", "lookup"))
    names = kinds(events)
    start = names.index("tool_execution_in_progress")
    assert names[start + 1 : start + 4] == [
        "tool_execution_progress",
        "tool_execution_progress",
        "tool_execution_completed",
    ]
    assert [e.tool_execution_progress.message for e in events if kinds([e])[0] == "tool_execution_progress"] == [
        "connecting",
        "reading",
    ]


async def test_non_streaming_loop_uses_the_complete_path_and_returns_everything() -> None:
    provider = ScriptedProvider([[Reasoning("thinking"), Call.of("lookup", {"q": "a"})], [Text("Final answer.")]])
    async with running_gateway(provider=provider, executors=[MockExecutor({"lookup": echo})]) as gw:
        response = await gw.create(with_tools("Check", "lookup"))
    assert response.status == S.RESPONSE_STATUS_COMPLETED
    assert output_kinds(response) == ["reasoning", "function_call", "function_call_output", "message"]
    assert output_text(response) == "Final answer."
    assert response.usage.total_tokens == 30
    assert all(item.id for item in response.output)
    assert provider.modes == ["complete", "complete"]


async def test_required_and_forced_choice_apply_to_the_first_turn_only() -> None:
    for choice in (
        pb.ToolChoice(mode=pb.ToolChoiceMode.TOOL_CHOICE_MODE_REQUIRED),
        pb.ToolChoice(function=pb.NamedToolChoice(name="lookup")),
    ):
        provider = ScriptedProvider([[Call.of("lookup", {"q": "a"})], [Text("done")]])
        async with running_gateway(provider=provider, executors=[MockExecutor({"lookup": echo})]) as gw:
            request = with_tools("Check", "lookup")
            request.tool_choice.CopyFrom(choice)
            response = final(await gw.stream(request))
        assert response.status == S.RESPONSE_STATUS_COMPLETED
        assert provider.requests[0].tool_choice == choice
        assert provider.requests[1].tool_choice is None, "falls back to auto so the loop can end"
        assert response.tool_choice == choice, "the response echoes what the client asked for"
