"""Response translation, streaming and non-streaming, against the fake backend over real HTTP."""

from __future__ import annotations

from antwort_grpc import pb
from antwort_grpc.providers.base import FinishReason, ReasoningDelta, TextDelta, TurnEnd
from antwort_grpc.providers.openai import OpenAICompatProvider
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply, ScriptedToolCall

from .turns import drain, turn


async def test_text_arrives_as_deltas_and_the_turn_ends_with_stop_and_usage(
    fake: FakeOpenAI, provider: OpenAICompatProvider
) -> None:
    fake.add(Reply(text="Hello there, world", prompt_tokens=11, completion_tokens=3))

    out = await drain(provider, turn())

    assert [e.text for e in out.events if isinstance(e, TextDelta)] == ["Hello ", "there, ", "world"]
    assert out.finish is FinishReason.STOP
    assert out.end is not None and out.end.usage == pb.Usage(input_tokens=11, output_tokens=3, total_tokens=14)


async def test_the_role_only_first_chunk_yields_nothing(fake: FakeOpenAI, provider: OpenAICompatProvider) -> None:
    fake.add(Reply(tool_calls=[ScriptedToolCall(name="lookup", arguments='{"q":"x"}')]))

    out = await drain(provider, turn())

    # A tool-only turn: no text delta at all, so the engine opens no message item.
    assert not any(isinstance(e, TextDelta) for e in out.events)
    assert out.finish is FinishReason.TOOL_CALLS


async def test_parallel_tool_calls_keep_the_models_order_and_ids(
    fake: FakeOpenAI, provider: OpenAICompatProvider
) -> None:
    fake.add(
        Reply(
            tool_calls=[
                ScriptedToolCall(id="call_a", name="get_weather", arguments='{"city":"Paris"}', fragments=3),
                ScriptedToolCall(id="call_b", name="get_time", arguments='{"tz":"CET"}'),
            ]
        )
    )

    out = await drain(provider, turn())

    assert [(c.call_id, c.name, c.arguments) for c in out.calls] == [
        ("call_a", "get_weather", '{"city":"Paris"}'),
        ("call_b", "get_time", '{"tz":"CET"}'),
    ]
    assert out.finish is FinishReason.TOOL_CALLS


async def test_reasoning_content_becomes_reasoning_deltas_before_the_text(
    fake: FakeOpenAI, provider: OpenAICompatProvider
) -> None:
    fake.add(Reply(reasoning="Let me think.", text="42"))

    out = await drain(provider, turn())

    kinds = [type(e) for e in out.events]
    assert kinds == [ReasoningDelta, ReasoningDelta, ReasoningDelta, TextDelta, TurnEnd]
    assert (out.reasoning, out.text) == ("Let me think.", "42")


async def test_length_and_content_filter_finish_reasons_reach_the_engine(
    fake: FakeOpenAI, provider: OpenAICompatProvider
) -> None:
    fake.add(Reply(text="cut sh", finish_reason="length"), Reply(text="", finish_reason="content_filter"))

    assert (await drain(provider, turn())).finish is FinishReason.LENGTH
    assert (await drain(provider, turn())).finish is FinishReason.CONTENT_FILTER


async def test_a_refusal_arrives_as_refusal_deltas(fake: FakeOpenAI, provider: OpenAICompatProvider) -> None:
    fake.add(Reply(refusal="I can't help with that."))

    out = await drain(provider, turn())

    assert out.refusal == "I can't help with that." and out.text == ""


async def test_usage_that_follows_the_finish_chunk_is_not_lost(
    fake: FakeOpenAI, provider: OpenAICompatProvider
) -> None:
    fake.add(Reply(text="ok", prompt_tokens=5, completion_tokens=1))

    out = await drain(provider, turn())

    body = fake.chat_requests[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert out.end is not None and out.end.usage is not None and out.end.usage.input_tokens == 5


async def test_a_stream_without_done_that_finished_still_ends_the_turn(
    fake: FakeOpenAI, provider: OpenAICompatProvider
) -> None:
    fake.add(Reply(text="done", send_done=False))

    out = await drain(provider, turn())

    assert out.text == "done" and out.finish is FinishReason.STOP


async def test_non_streaming_gives_items_in_the_models_order(fake: FakeOpenAI, provider: OpenAICompatProvider) -> None:
    fake.add(
        Reply(
            reasoning="thinking",
            text="Calling it.",
            tool_calls=[
                ScriptedToolCall(id="c1", name="a", arguments="{}"),
                ScriptedToolCall(id="c2", name="b", arguments='{"x":1}'),
            ],
            prompt_tokens=9,
            completion_tokens=4,
        )
    )

    result = await provider.complete(turn())

    assert "stream" not in fake.chat_requests[0]
    kinds = [item.WhichOneof("kind") for item in result.items]
    assert kinds == ["reasoning", "message", "function_call", "function_call"]
    assert result.items[0].reasoning.text == "thinking"
    assert result.items[1].message.role == pb.Role.ROLE_ASSISTANT
    assert result.items[1].message.content[0].output_text.text == "Calling it."
    assert [(i.function_call.call_id, i.function_call.arguments) for i in result.items[2:]] == [
        ("c1", "{}"),
        ("c2", '{"x":1}'),
    ]
    assert result.finish is FinishReason.TOOL_CALLS
    assert result.usage == pb.Usage(input_tokens=9, output_tokens=4, total_tokens=13)


async def test_non_streaming_finish_reasons_and_refusal(fake: FakeOpenAI, provider: OpenAICompatProvider) -> None:
    fake.add(
        Reply(text="partial", finish_reason="length"),
        Reply(finish_reason="content_filter"),
        Reply(refusal="No."),
    )

    assert (await provider.complete(turn())).finish is FinishReason.LENGTH
    filtered = await provider.complete(turn())
    assert filtered.finish is FinishReason.CONTENT_FILTER and filtered.items == []
    refused = await provider.complete(turn())
    assert refused.items[0].message.content[0].refusal.refusal == "No."
