"""Property: however a backend's chunks are grouped into reads, coalescing the deltas of each read
changes neither the text a client reassembles nor the items and parts of the stream; only runs
of deltas of one part become fewer, fuller deltas. A read of one chunk passes through as it is."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from antwort_grpc import pb
from antwort_grpc.engine.emitter import ResponseEmitter
from antwort_grpc.providers.base import ProviderEvent, ReasoningDelta, RefusalDelta, TextDelta, ToolCallDelta
from antwort_grpc.providers.coalesce import merge_deltas
from tests.harness import assert_valid_stream

text = st.text(min_size=1, max_size=6)
delta = st.one_of(
    st.builds(TextDelta, text),
    st.builds(ReasoningDelta, text),
    st.builds(RefusalDelta, text),
    st.tuples(st.integers(0, 2), st.text(max_size=6)),
)

DELTAS = ("output_text_delta", "refusal_delta", "reasoning_text_delta", "function_call_arguments_delta")


def as_provider_events(drawn: list[object]) -> list[ProviderEvent]:
    """Tool-call fragments as a translator yields them: the first of each index names the call."""
    events: list[ProviderEvent] = []
    named: set[int] = set()
    for d in drawn:
        if isinstance(d, tuple):
            index, arguments = d
            if index in named:
                events.append(ToolCallDelta(index, arguments))
            else:
                named.add(index)
                events.append(ToolCallDelta(index, arguments, call_id=f"call_{index}", name="tool"))
        else:
            events.append(d)  # type: ignore[arg-type]
    return events


def stream(reads: list[list[ProviderEvent]]) -> tuple[list[pb.StreamEvent], pb.Response]:
    response = pb.Response(id="resp_1", status=pb.ResponseStatus.RESPONSE_STATUS_IN_PROGRESS)
    emitter = ResponseEmitter(response)
    events = [emitter.created(), emitter.in_progress()]
    for read in reads:
        for e in read:
            if isinstance(e, TextDelta):
                events += emitter.on_text(e.text)
            elif isinstance(e, RefusalDelta):
                events += emitter.on_refusal(e.text)
            elif isinstance(e, ReasoningDelta):
                events += emitter.on_reasoning(e.text)
            else:
                assert isinstance(e, ToolCallDelta)
                events += emitter.on_tool_call(e.index, e.call_id, e.name, e.arguments)
    events += emitter.close_turn()
    response.status = pb.ResponseStatus.RESPONSE_STATUS_COMPLETED
    events.append(emitter.terminal())
    return events, response


def part_texts(events: list[pb.StreamEvent]) -> dict[tuple[str, int, int], str]:
    """The text each part's deltas reassemble to, by (kind, output index, content index)."""
    texts: dict[tuple[str, int, int], str] = {}
    for e in events:
        kind = e.WhichOneof("event")
        if kind in DELTAS:
            d = getattr(e, kind)
            key = (kind, d.output_index, getattr(d, "content_index", 0))
            texts[key] = texts.get(key, "") + d.delta
    return texts


def shape(events: list[pb.StreamEvent]) -> list[str]:
    """Event kinds with each run of deltas of one part counted once."""
    kinds: list[str] = []
    last: tuple[str, int, int] | None = None
    for e in events:
        kind = e.WhichOneof("event") or ""
        if kind in DELTAS:
            d = getattr(e, kind)
            key = (kind, d.output_index, getattr(d, "content_index", 0))
            if key == last:
                continue
            last = key
        else:
            last = None
        kinds.append(kind)
    return kinds


def without_ids(response: pb.Response) -> list[pb.Item]:
    items = []
    for item in response.output:
        copy = pb.Item()
        copy.CopyFrom(item)
        copy.id = ""
        items.append(copy)
    return items


@settings(max_examples=400, deadline=None)
@given(
    drawn=st.lists(delta, max_size=30),
    cuts=st.lists(st.integers(0, 30), max_size=10),
    limit=st.integers(1, 20),
)
def test_coalescing_any_grouping_keeps_the_text_and_the_structure(
    drawn: list[object], cuts: list[int], limit: int
) -> None:
    chunks = as_provider_events(drawn)
    bounds = sorted({0, len(chunks), *(c for c in cuts if c <= len(chunks))})
    reads = [chunks[a:b] for a, b in itertools.pairwise(bounds)]

    plain, plain_response = stream([[c] for c in chunks])
    merged, merged_response = stream([merge_deltas(read, limit) for read in reads])

    assert_valid_stream(merged)  # dense sequence numbers, items and parts opened and closed in order
    assert part_texts(merged) == part_texts(plain)
    assert shape(merged) == shape(plain)
    assert without_ids(merged_response) == without_ids(plain_response)
    assert len(merged) <= len(plain)


@given(chunk=delta)
def test_a_read_of_one_chunk_passes_through_unchanged(chunk: object) -> None:
    (event,) = as_provider_events([chunk])
    assert merge_deltas([event]) == [event]
