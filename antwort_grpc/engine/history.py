"""Conversation state: rebuild a request's context from the chain of earlier responses, or from
the items of a conversation the gateway keeps (storage/conversations.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from antwort_grpc import pb
from antwort_grpc.errors import FieldViolation, RequestError, not_found
from antwort_grpc.storage.base import ResponseStore, StoredResponse
from antwort_grpc.storage.conversations import ConversationStore

# The most a chain may hold (its responses' input and output, serialized), so a request cannot
# make the gateway load without bound; measured as the chain is read, so it stops at the cap.
HISTORY_MAX_BYTES = 16 * 1024 * 1024


@dataclass(slots=True)
class History:
    # The earlier input and output of every response in the chain, oldest first.
    items: list[pb.Item] = field(default_factory=list)
    # The calls the model made (function_call items of the responses' output), by call id, as the
    # model made them: only these may run on a server when a continuation picks them up.
    model_calls: dict[str, pb.FunctionCall] = field(default_factory=dict)


async def load_history(
    store: ResponseStore, previous_id: str, *, owner: str, max_depth: int, max_bytes: int = HISTORY_MAX_BYTES
) -> History:
    """The conversation so far, from the chain of responses ending at `previous_id`.

    Raises NOT_FOUND for a missing link, FAILED_PRECONDITION for a response that is still running,
    a cycle, a chain longer than `max_depth` or one holding more than `max_bytes`.
    """
    chain: list[StoredResponse] = []
    seen: set[str] = set()
    current = previous_id
    size = 0
    while current:
        if current in seen:
            raise _precondition(f"previous_response_id chain has a cycle at {current!r}")
        if len(chain) >= max_depth:
            raise _precondition(f"previous_response_id chain is longer than {max_depth} responses")
        record = await store.get(current, owner)
        if record is None:
            if current == previous_id:
                raise not_found("response", current, "previous_response_id")
            raise not_found("response (earlier in the previous_response_id chain)", current, "previous_response_id")
        if current == previous_id and record.response.status in (
            pb.ResponseStatus.RESPONSE_STATUS_IN_PROGRESS,
            pb.ResponseStatus.RESPONSE_STATUS_QUEUED,
        ):
            raise _precondition(f"response {current!r} is still in progress")
        size += record.response.ByteSize() + sum(item.ByteSize() for item in record.input_items)
        if size > max_bytes:
            raise _precondition(f"previous_response_id chain holds more than {max_bytes} bytes of input and output")
        chain.append(record)
        seen.add(current)
        current = record.response.previous_response_id
    history = History()
    for record in reversed(chain):
        history.items += record.input_items
        for item in record.response.output:
            if item.superseded:
                continue  # begun by a replica lost mid-run, done again by the run that took it over
            history.items.append(item)
            if item.WhichOneof("kind") == "function_call":
                history.model_calls[item.function_call.call_id] = item.function_call
    return history


async def load_conversation(store: object, conversation_id: str, *, owner: str, max_bytes: int) -> History:
    """The items of a kept conversation, oldest first. NOT_FOUND when it does not exist (for this
    owner); FAILED_PRECONDITION when it holds more than `max_bytes`."""
    kept = getattr(store, "conversations", None)
    if not isinstance(kept, ConversationStore):
        raise RequestError(
            grpc.StatusCode.UNIMPLEMENTED,
            "this gateway's response store keeps no conversations",
            [FieldViolation("conversation_id", "conversations are not supported by this store")],
            "conversations_unsupported",
        )
    entries = await kept.entries(conversation_id, owner)
    if entries is None:
        raise not_found("conversation", conversation_id, "conversation_id")
    history = History()
    size = 0
    for entry in entries:
        size += entry.item.ByteSize()
        if entry.item.superseded:
            continue
        history.items.append(entry.item)
        # Only calls a response's model made may run on our side when a continuation picks them up.
        if entry.from_model and entry.item.WhichOneof("kind") == "function_call":
            history.model_calls[entry.item.function_call.call_id] = entry.item.function_call
    if size > max_bytes:
        message = f"conversation {conversation_id!r} holds more than {max_bytes} bytes of items"
        raise RequestError(
            grpc.StatusCode.FAILED_PRECONDITION,
            message,
            [FieldViolation("conversation_id", message)],
            "conversation_too_large",
        )
    return history


def _precondition(message: str) -> RequestError:
    return RequestError(
        grpc.StatusCode.FAILED_PRECONDITION,
        message,
        [FieldViolation("previous_response_id", message)],
        "invalid_previous_response",
    )
