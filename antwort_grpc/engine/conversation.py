"""A response created in a kept conversation adds its input and output to it when it ends."""

from __future__ import annotations

import logging

from antwort_grpc import pb
from antwort_grpc.engine.run import Run
from antwort_grpc.storage.conversations import ConversationStore, Entry

log = logging.getLogger(__name__)

S = pb.ResponseStatus
# What a conversation keeps of a response that ended: not one that failed or was cancelled (as
# OpenAI), whose partial output would be the next response's history.
KEPT: frozenset[int] = frozenset(
    {S.RESPONSE_STATUS_COMPLETED, S.RESPONSE_STATUS_INCOMPLETE, S.RESPONSE_STATUS_REQUIRES_ACTION}
)


async def conversation_append(store: object, run: Run) -> None:
    """Append the run's input and output to its conversation (one append: the block stays whole
    and in order whatever else is appended at the same time)."""
    response = run.response
    if response.status not in KEPT:
        return
    kept = getattr(store, "conversations", None)
    if not isinstance(kept, ConversationStore):
        return  # refused before the response started (engine.history)
    entries = [Entry(item) for item in run.input_items] + [Entry(item, True) for item in response.output]
    try:
        appended = await kept.append(run.request.conversation_id, entries, run.owner)
    except Exception:
        log.exception("response %s: appending to conversation %s failed", response.id, run.request.conversation_id)
        return
    if not appended:
        log.warning(
            "response %s: conversation %s was deleted while the response ran; its items are not kept",
            response.id,
            run.request.conversation_id,
        )
