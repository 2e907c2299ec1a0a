"""The chunks of a streamed answer are decoded by msgspec, with the pydantic model deciding every
chunk msgspec refuses: the same chunks accepted, the same values, the same error for a bad one."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from antwort_grpc.providers.base import ProviderError
from antwort_grpc.providers.openai import chunks, wire
from antwort_grpc.providers.openai.translate import StreamTranslator

# Values of every JSON type, the awkward ones among them (floats that are whole, integers past 64
# bits, numeric strings), for any field.
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, 2, 1.0, 0.5, -1.0, "0", "1", "", "stop", "tool_calls", "x"]),
    st.text(max_size=4),
)
_any = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
    max_leaves=4,
)


def _maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(value, _any)


def _object(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional={name: _maybe(value) for name, value in fields.items()})


_text = st.one_of(st.none(), st.text(max_size=5))
_function = _object({"name": _text, "arguments": _text})
_call = _object({"index": st.one_of(st.none(), st.integers(0, 3)), "id": _text, "function": _function})
_delta = _object(
    {
        "role": _text,
        "content": _text,
        "reasoning_content": _text,
        "reasoning": _text,
        "refusal": _text,
        "tool_calls": st.one_of(st.none(), st.lists(_call, max_size=2)),
    }
)
_choice = _object({"index": st.integers(0, 2), "delta": _delta, "finish_reason": _text})
_usage = _object(
    {"prompt_tokens": st.integers(0, 9), "completion_tokens": st.integers(0, 9), "total_tokens": st.integers(0, 9)}
)
_error = _object(
    {"message": st.text(max_size=5), "type": _text, "code": st.one_of(st.integers(400, 599), st.text(max_size=3))}
)
_chunk = _object({"choices": st.lists(_choice, max_size=2), "usage": _usage, "error": _error})


def _dump(chunk: chunks.Chunk) -> Any:
    return chunk.model_dump() if isinstance(chunk, wire.ChatCompletionChunk) else msgspec.to_builtins(chunk)


def _translated(chunk: chunks.Chunk) -> tuple[list[Any], Any]:
    translator = StreamTranslator()
    try:
        events = translator.feed(chunk)
        return events, translator.end()
    except ProviderError as error:
        return [], (error.code, error.message.split("call_")[0])


@settings(max_examples=400, deadline=None)
@given(_chunk)
def test_a_chunk_msgspec_accepts_is_one_pydantic_accepts_with_the_same_values(value: dict[str, Any]) -> None:
    data = json.dumps(value).encode()
    try:
        fast = msgspec.json.decode(data, type=chunks.ChatCompletionChunk)
    except msgspec.DecodeError:
        return  # refused: the pydantic model decides (the next test)
    slow = wire.ChatCompletionChunk.model_validate_json(data)
    assert msgspec.to_builtins(fast) == slow.model_dump()
    fast_events, fast_end = _translated(fast)
    slow_events, slow_end = _translated(slow)
    assert [type(e) for e in fast_events] == [type(e) for e in slow_events]
    assert fast_end == slow_end


@settings(max_examples=400, deadline=None)
@given(_chunk)
def test_any_chunk_is_decoded_or_refused_as_the_pydantic_model_alone_does(value: dict[str, Any]) -> None:
    data = json.dumps(value).encode()
    try:
        expected: Any = wire.ChatCompletionChunk.model_validate_json(data).model_dump()
    except ValidationError as error:
        expected = chunks.protocol_error(data, error).message
    try:
        got: Any = _dump(chunks.decode_chunk(data))
    except ProviderError as error:
        assert error.code == "backend_protocol_error"
        got = error.message
    assert got == expected


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            b"{not json",
            "the model backend sent malformed data "
            "(Invalid JSON: key must be a string at line 1 column 2): '{not json'",
        ),
        (
            b'{"choices":[{"delta":{"content":5}}]}',
            "the model backend sent malformed data (Input should be a valid string): "
            '\'{"choices":[{"delta":{"content":5}}]}\'',
        ),
        (
            b'{"choices":null}',
            "the model backend sent malformed data (Input should be a valid array): '{\"choices\":null}'",
        ),
        (b"[]", "the model backend sent malformed data (Input should be an object): '[]'"),
    ],
)
def test_a_malformed_chunk_is_reported_as_before(data: bytes, message: str) -> None:
    with pytest.raises(ProviderError) as raised:
        chunks.decode_chunk(data)
    assert raised.value.code == "backend_protocol_error"
    assert raised.value.message == message


@pytest.mark.parametrize(
    "data",
    [
        b'{"choices":[{"index":"0","delta":{"content":"a"}}]}',
        b'{"choices":[{"index":0.0,"delta":{"content":"a"}}]}',
        b'{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":99999999999999999999999}}',
    ],
)
def test_chunks_the_pydantic_model_accepted_are_still_accepted(data: bytes) -> None:
    assert _dump(chunks.decode_chunk(data)) == wire.ChatCompletionChunk.model_validate_json(data).model_dump()
