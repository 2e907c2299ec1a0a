"""Property: whatever sequence of deltas a backend sends, the stream stays valid and the
response holds exactly what was streamed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from antwort_grpc import pb
from antwort_grpc.engine.emitter import ResponseEmitter
from tests.harness import assert_valid_stream

delta = st.one_of(
    st.tuples(st.just("text"), st.text(min_size=1, max_size=5)),
    st.tuples(st.just("refusal"), st.text(min_size=1, max_size=5)),
    st.tuples(st.just("reasoning"), st.text(min_size=1, max_size=5)),
    st.tuples(st.just("call"), st.integers(0, 3), st.text(max_size=5)),
)


@settings(max_examples=300, deadline=None)
@given(turns=st.lists(st.lists(delta, max_size=12), min_size=1, max_size=3), incomplete=st.booleans())
def test_any_delta_sequence_gives_a_valid_stream(turns: list[list[tuple]], incomplete: bool) -> None:  # type: ignore[type-arg]
    response = pb.Response(id="resp_1", status=pb.ResponseStatus.RESPONSE_STATUS_IN_PROGRESS)
    emitter = ResponseEmitter(response)
    events = [emitter.created(), emitter.in_progress()]
    texts: list[str] = []
    arguments: dict[tuple[int, int], list[str]] = {}
    for turn_number, turn in enumerate(turns):
        emitter.start_turn()
        for d in turn:
            if d[0] == "text":
                events += emitter.on_text(d[1])
                texts.append(d[1])
            elif d[0] == "refusal":
                events += emitter.on_refusal(d[1])
            elif d[0] == "reasoning":
                events += emitter.on_reasoning(d[1])
            else:
                events += emitter.on_tool_call(d[1], f"call_{turn_number}_{d[1]}", "tool", d[2])
                arguments.setdefault((turn_number, d[1]), []).append(d[2])
        status = pb.ItemStatus.ITEM_STATUS_INCOMPLETE if incomplete else pb.ItemStatus.ITEM_STATUS_COMPLETED
        events += emitter.close_turn(status)
    response.status = pb.ResponseStatus.RESPONSE_STATUS_COMPLETED
    events.append(emitter.terminal())
    assert_valid_stream(events)
    streamed = "".join(e.output_text_delta.delta for e in events if e.WhichOneof("event") == "output_text_delta")
    assert streamed == "".join(texts)
    kept = "".join(
        p.output_text.text for i in response.output for p in i.message.content if p.WhichOneof("part") == "output_text"
    )
    assert kept == streamed
    calls = {i.function_call.call_id: i.function_call.arguments for i in response.output if i.HasField("function_call")}
    for (turn_number, index), parts in arguments.items():
        assert calls[f"call_{turn_number}_{index}"] == "".join(parts)
