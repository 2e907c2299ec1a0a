"""`POST /v1/responses/compact` over HTTP: the spec's CompactResponseMethodPublicBody decoded into
the core's compaction request (front/compaction.py), and its answer as the spec's CompactResource,
whose output is one `compaction` item. Sent back as input, that item stands for the conversation
it summarizes (mapping.py reads it as a developer message holding the summary)."""

from __future__ import annotations

from antwort_grpc import pb
from antwort_grpc.front.compaction import Compacted, copy_input
from antwort_grpc.http.jsonread import JSON, fail, obj, string
from antwort_grpc.http.mapping import compaction_content, create_request, usage_json
from antwort_grpc.ids import new_id

# The spec's parameters, and `conversation` (an id or {"id"}, as on create): OpenAI's compact
# takes no conversation; here its items are what is summarized (docs/http.md).
PARAMETERS = frozenset({"model", "input", "previous_response_id", "conversation", "instructions", "prompt_cache_key"})


def compaction_request(body: object) -> pb.CompactConversationRequest:
    """The compaction a body asks for; RequestError (INVALID_ARGUMENT, the parameter named) for a
    body the spec does not allow."""
    entry = obj(body, "body")
    for key in entry:
        if key not in PARAMETERS:
            fail(key, "unknown parameter of a compact request")
    if entry.get("model") is None:
        fail("model", "required: the model to use ('' for the gateway's default)")
    parameters = {key: entry[key] for key in ("model", "input", "previous_response_id", "conversation") if key in entry}
    create = create_request(parameters)
    compact = pb.CompactConversationRequest(
        model=create.model, previous_response_id=create.previous_response_id, conversation_id=create.conversation_id
    )
    copy_input(create, compact)
    theirs = entry.get("instructions")
    if theirs is not None:
        compact.instructions = string(theirs, "instructions")
    return compact


def compacted_json(compacted: Compacted) -> JSON:
    """The spec's CompactResource for the summarizing response."""
    response = compacted.response
    item = {"type": "compaction", "id": new_id("cmp"), "encrypted_content": compaction_content(compacted.summary)}
    return {
        "id": response.id,
        "object": "response.compaction",
        "created_at": response.created_at.seconds,
        "output": [item],
        "usage": usage_json(response.usage),
    }
