"""Compaction: a conversation summarized by the model into one item that stands for it.

The model is asked, through the same path as any response (validation, tenancy, admission,
hooks, observation), to summarize the conversation: the request's input, after the chain of
`previous_response_id` or after the items of a kept conversation (`conversation_id`, read as a
create that continues it reads it). Nothing is stored, and the conversation is left as it was.
The summary comes back as a developer message; sent back as input, it stands for the
conversation it summarizes."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from antwort_grpc import pb
from antwort_grpc.errors import RequestError

COMPACT_INSTRUCTIONS = (
    "Summarize the conversation so far so that it can go on from your summary alone: keep every fact, "
    "decision, name, number and open question, and what the user asked for. Answer with the summary only."
)
SUMMARY_HEADING = "Summary of the conversation so far:\n"


@dataclass(frozen=True)
class Compacted:
    """The summarizing response (its id, usage and time) and the summary it made."""

    response: pb.Response
    summary: str

    def item(self) -> pb.Item:
        """The summary as the item that stands for the conversation."""
        part = pb.ContentPart(input_text=pb.InputText(text=SUMMARY_HEADING + self.summary))
        return pb.Item(message=pb.Message(role=pb.Role.ROLE_DEVELOPER, content=[part]))


def summarizing_request(compact: pb.CompactConversationRequest) -> pb.CreateResponseRequest:
    """The response that summarizes the conversation `compact` names."""
    request = pb.CreateResponseRequest(
        model=compact.model,
        previous_response_id=compact.previous_response_id,
        conversation_id=compact.conversation_id,
    )
    copy_input(compact, request)
    request.instructions = COMPACT_INSTRUCTIONS
    if compact.instructions:
        request.instructions += "\n\nThe conversation ran under these instructions:\n" + compact.instructions
    request.store = False
    request.tool_choice.mode = pb.ToolChoiceMode.TOOL_CHOICE_MODE_NONE
    return request


def copy_input(
    source: pb.CreateResponseRequest | pb.CompactConversationRequest,
    target: pb.CreateResponseRequest | pb.CompactConversationRequest,
) -> None:
    """The conversation's input (text or items), from one request to the other."""
    which = source.WhichOneof("input")
    if which == "input_text":
        target.input_text = source.input_text
    elif which == "input_items":
        target.input_items.CopyFrom(source.input_items)


def summary_of(response: pb.Response) -> Compacted:
    """The summary a completed summarizing response made; UNAVAILABLE when it did not complete."""
    if response.status != pb.ResponseStatus.RESPONSE_STATUS_COMPLETED:
        raise RequestError(
            grpc.StatusCode.UNAVAILABLE,
            f"the conversation could not be summarized: {response.error.message or 'the response ended early'}",
            reason=response.error.code or "compaction_failed",
        )
    summary = "".join(
        part.output_text.text
        for item in response.output
        if item.WhichOneof("kind") == "message"
        for part in item.message.content
        if part.WhichOneof("part") == "output_text"
    )
    return Compacted(response, summary)
