"""CompactConversation: the compaction the HTTP door offers, over gRPC too (it lives in the core).
The conversation after the chain of previous_response_id is summarized by the model into one
developer message that stands for it as input; nothing is stored; bad input is INVALID_ARGUMENT
and a missing earlier response NOT_FOUND, as for a create."""

from __future__ import annotations

import grpc
import pytest

from antwort_grpc import pb
from antwort_grpc.providers.scripted import ScriptedProvider, Text
from tests.harness import running_gateway, user

SUMMARY = "The user is Alice; the launch is on Tuesday."


async def test_a_conversation_is_compacted_over_grpc_into_one_item_that_stands_for_it() -> None:
    provider = ScriptedProvider([[Text("Noted.")], [Text(SUMMARY)], [Text("Tuesday.")]])
    async with running_gateway(provider=provider) as gw:
        first = await gw.create(user("I am Alice. We launch on Tuesday."))
        request = pb.CompactConversationRequest(previous_response_id=first.id, input_text="Support is told first.")
        compacted = await gw.stub.CompactConversation(request)
        summary = compacted.summary.message
        assert summary.role == pb.Role.ROLE_DEVELOPER
        assert SUMMARY in summary.content[0].input_text.text
        asked = provider.requests[-1]
        assert "Summarize the conversation" in asked.instructions
        assert compacted.usage.total_tokens >= 0
        assert await gw.store.get(compacted.id) is None
        # Sent back as input, the summary stands for the conversation.
        again = pb.CreateResponseRequest(input_items=pb.ItemList(items=[compacted.summary, _message("When?")]))
        answered = await gw.create(again)
        assert answered.status == pb.ResponseStatus.RESPONSE_STATUS_COMPLETED
        sent = provider.requests[-1]
        assert SUMMARY in sent.items[0].message.content[0].input_text.text


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (pb.CompactConversationRequest(input_text="x", model="m" * 300), grpc.StatusCode.INVALID_ARGUMENT),
        (
            pb.CompactConversationRequest(previous_response_id="resp_0123456789abcdef0123456789abcdef"),
            grpc.StatusCode.NOT_FOUND,
        ),
    ],
)
async def test_a_bad_compaction_is_refused_as_a_create_is(
    request_: pb.CompactConversationRequest, code: object
) -> None:
    async with running_gateway(provider=ScriptedProvider([[Text("x")]])) as gw:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await gw.stub.CompactConversation(request_)
    assert raised.value.code() == code


def _message(text: str) -> pb.Item:
    part = pb.ContentPart(input_text=pb.InputText(text=text))
    return pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[part]))
