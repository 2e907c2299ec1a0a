"""A response created in a kept conversation adds its input and output to it when it ends."""

from __future__ import annotations

import logging

from antwort_grpc import pb
from antwort_grpc.engine.run import Run
from antwort_grpc.storage.base import StoredResponse
from antwort_grpc.storage.conversations import ConversationStore, Entry, SavesInConversation

log = logging.getLogger(__name__)

S = pb.ResponseStatus
# What a conversation keeps of a response that ended: not one that failed or was cancelled (as
# OpenAI), whose partial output would be the next response's history.
KEPT: frozenset[int] = frozenset(
    {S.RESPONSE_STATUS_COMPLETED, S.RESPONSE_STATUS_INCOMPLETE, S.RESPONSE_STATUS_REQUIRES_ACTION}
)


async def conversation_append(store: object, run: Run) -> bool:
    """Append the run's input and output to its conversation (one append: the block stays whole
    and in order whatever else is appended at the same time), with the response's final save in
    the same transaction where the store keeps both: a replica that dies in between leaves
    neither, so a background run taken over by another replica is appended once, by the replica
    that ends it (a first append then a save would let the new owner append it a second time).
    True when the response was saved here; the caller saves it otherwise."""
    response = run.response
    if response.status not in KEPT:
        return False
    kept = getattr(store, "conversations", None)
    if not isinstance(kept, ConversationStore):
        return False  # refused before the response started (engine.history)
    conversation_id = run.request.conversation_id
    entries = [Entry(item) for item in run.input_items] + [Entry(item, True) for item in response.output]
    saved = False
    try:
        if response.store and isinstance(store, SavesInConversation):
            record = StoredResponse(response, run.input_items, run.owner)
            appended = await store.save_in_conversation(record, conversation_id, entries)
            saved = True
        else:
            appended = await kept.append(conversation_id, entries, run.owner)
    except Exception:
        log.exception("response %s: appending to conversation %s failed", response.id, conversation_id)
        return False
    if not appended:
        log.warning(
            "response %s: conversation %s was deleted while the response ran; its items are not kept",
            response.id,
            conversation_id,
        )
    return saved
