"""CompactConversation: the compaction the HTTP door offers, over gRPC too (it lives in the core).
The conversation after the chain of previous_response_id, or after a kept conversation's items,
is summarized by the model into one developer message that stands for it as input; nothing is
stored and the kept conversation is left as it was; bad input is INVALID_ARGUMENT and a missing
earlier response or conversation NOT_FOUND, as for a create."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from antwort_grpc import pb
from antwort_grpc.providers.scripted import ScriptedProvider, Text
from tests.auth_fixtures import api_keys
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
        (pb.CompactConversationRequest(conversation_id="conv_0123456789abcdef"), grpc.StatusCode.NOT_FOUND),
        (
            pb.CompactConversationRequest(conversation_id="conv_1", previous_response_id="resp_1"),
            grpc.StatusCode.INVALID_ARGUMENT,
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


async def test_a_kept_conversation_is_compacted_and_left_as_it_was() -> None:
    provider = ScriptedProvider([[Text("Noted.")], [Text(SUMMARY)], [Text(SUMMARY)]])
    async with running_gateway(provider=provider) as gw:
        conversations = pb.ConversationsServiceStub(gw.channel)
        created = await conversations.CreateConversation(pb.CreateConversationRequest(items=[_message("I am Alice.")]))
        conversation_id = created.conversation.id
        await gw.create(pb.CreateResponseRequest(input_text="We launch on Tuesday.", conversation_id=conversation_id))
        before = await conversations.ListConversationItems(
            pb.ListConversationItemsRequest(conversation_id=conversation_id)
        )
        compacted = await gw.stub.CompactConversation(
            pb.CompactConversationRequest(conversation_id=conversation_id, input_text="Support is told first.")
        )
        assert SUMMARY in compacted.summary.message.content[0].input_text.text
        asked = provider.requests[-1]
        assert "Summarize the conversation" in asked.instructions
        assert [_text(item) for item in asked.items] == [
            "I am Alice.",
            "We launch on Tuesday.",
            "Noted.",
            "Support is told first.",
        ]
        # The conversation alone, without more input, is what is summarized.
        alone = await gw.stub.CompactConversation(pb.CompactConversationRequest(conversation_id=conversation_id))
        assert SUMMARY in alone.summary.message.content[0].input_text.text
        assert [_text(item) for item in provider.requests[-1].items] == [_text(item) for item in before.items]
        after = await conversations.ListConversationItems(
            pb.ListConversationItemsRequest(conversation_id=conversation_id)
        )
        assert after == before
        assert await gw.store.get(compacted.id) is None


async def test_another_owners_conversation_is_not_compacted_exactly_as_an_unknown_one(tmp_path: Path) -> None:
    credentials = api_keys(tmp_path)
    provider = ScriptedProvider([[Text(SUMMARY)]])
    async with running_gateway(provider=provider, **credentials.settings) as gw:
        conversations = pb.ConversationsServiceStub(gw.channel)
        created = await conversations.CreateConversation(
            pb.CreateConversationRequest(items=[_message("alice's secret")]), metadata=credentials.of("alice")
        )
        hers = created.conversation.id
        answers = []
        for conversation_id in (hers, "conv_0123456789abcdef"):
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await gw.stub.CompactConversation(
                    pb.CompactConversationRequest(conversation_id=conversation_id), metadata=credentials.of("bob")
                )
            error = raised.value
            answers.append((error.code(), (error.details() or "").replace(conversation_id, "ID")))
        assert answers[0] == answers[1] and answers[0][0] == grpc.StatusCode.NOT_FOUND
        assert not provider.requests


def _text(item: pb.Item) -> str:
    return "".join(part.input_text.text or part.output_text.text for part in item.message.content)


def _message(text: str) -> pb.Item:
    part = pb.ContentPart(input_text=pb.InputText(text=text))
    return pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[part]))
