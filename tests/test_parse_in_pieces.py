"""A large request parsed a piece at a time (protowire.parse_in_pieces) is the request parsing it
whole makes, whatever the pieces' size, and bytes that do not parse fail as they do whole."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from antwort_grpc import pb
from antwort_grpc.protowire import parse_in_pieces

texts = st.text(max_size=20)
parts = st.builds(lambda t: pb.ContentPart(input_text=pb.InputText(text=t)), texts)
items = st.one_of(
    st.builds(
        lambda role, content: pb.Item(message=pb.Message(role=role, content=content)),
        st.sampled_from([pb.Role.ROLE_USER, pb.Role.ROLE_ASSISTANT]),
        st.lists(parts, max_size=4),
    ),
    st.builds(lambda c, o: pb.Item(function_call_output=pb.FunctionCallOutput(call_id=c, output=o)), texts, texts),
)


def tool(name: str, properties: dict[str, str]) -> pb.Tool:
    made = pb.Tool()
    made.function.name = name
    made.function.parameters.update(
        {"type": "object", "properties": {k: {"description": v} for k, v in properties.items()}}
    )
    return made


tools = st.builds(tool, texts, st.dictionaries(texts, texts, max_size=4))
requests = st.builds(
    lambda model, listed, offered, metadata, text: pb.CreateResponseRequest(
        model=model,
        input_items=pb.ItemList(items=listed),
        tools=offered,
        metadata=metadata,
        instructions=text,
        temperature=0.5,
    ),
    texts,
    st.lists(items, max_size=30),
    st.lists(tools, max_size=4),
    st.dictionaries(texts, texts, max_size=3),
    texts,
)


@settings(max_examples=200, deadline=None)
@given(requests, st.integers(1, 400))
def test_a_request_parsed_in_pieces_is_the_request_parsed_whole(request: pb.CreateResponseRequest, piece: int) -> None:
    raw = request.SerializeToString()
    assert parse_in_pieces(pb.CreateResponseRequest, raw, piece) == pb.CreateResponseRequest.FromString(raw)


def test_input_text_and_a_converse_message_parse_in_pieces_too() -> None:
    request = pb.CreateResponseRequest(
        input_text="x" * 5000, tools=[tool(f"t{n}", {"a": "b" * 300}) for n in range(20)]
    )
    raw = request.SerializeToString()
    assert parse_in_pieces(pb.CreateResponseRequest, raw, 256) == request
    converse = pb.ConverseRequest(create=request)
    assert parse_in_pieces(pb.ConverseRequest, converse.SerializeToString(), 256) == converse


@pytest.mark.parametrize("cut", [1, 3, 100])
def test_bytes_that_do_not_parse_fail_in_pieces_as_whole(cut: int) -> None:
    listed = [pb.Item(message=pb.Message(content=[pb.ContentPart(input_text=pb.InputText(text="hi" * 50))]))] * 40
    raw = pb.CreateResponseRequest(input_items=pb.ItemList(items=listed)).SerializeToString()
    for broken in (raw[:-cut], raw[: len(raw) // 2] + b"\xff" * cut):
        with pytest.raises(DecodeError):
            pb.CreateResponseRequest.FromString(broken)
        with pytest.raises(DecodeError):
            parse_in_pieces(pb.CreateResponseRequest, broken, 300)
