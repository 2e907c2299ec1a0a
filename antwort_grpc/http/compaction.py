"""`POST /v1/responses/compact`: a conversation compacted into one `compaction` item.

The model is asked, through the same core as any response (validation, tenancy, admission,
hooks, observation), to summarize the conversation: the request's input, after the chain of
`previous_response_id`. Nothing is stored (`store: false`). The answer is the spec's
CompactResource whose output is one `compaction` item; sent back as input, it stands for the
conversation it summarizes (a developer message holding the summary, mapping.py)."""

from __future__ import annotations

from antwort_grpc import pb
from antwort_grpc.http.jsonread import JSON, fail, obj, string
from antwort_grpc.http.mapping import compaction_content, create_request, usage_json
from antwort_grpc.ids import new_id

COMPACT_INSTRUCTIONS = (
    "Summarize the conversation so far so that it can go on from your summary alone: keep every fact, "
    "decision, name, number and open question, and what the user asked for. Answer with the summary only."
)
PARAMETERS = frozenset({"model", "input", "previous_response_id", "instructions", "prompt_cache_key"})


def compaction_request(body: object) -> pb.CreateResponseRequest:
    """The response that summarizes the conversation a compact request names; RequestError
    (INVALID_ARGUMENT, the parameter named) for a body the spec's CompactResponseMethodPublicBody
    does not allow."""
    entry = obj(body, "body")
    for key in entry:
        if key not in PARAMETERS:
            fail(key, "unknown parameter of a compact request")
    if entry.get("model") is None:
        fail("model", "required: the model to use ('' for the gateway's default)")
    parameters = {key: entry[key] for key in ("model", "input", "previous_response_id") if key in entry}
    request = create_request(parameters).request
    theirs = entry.get("instructions")
    request.instructions = COMPACT_INSTRUCTIONS
    if theirs is not None:
        request.instructions += "\n\nThe conversation ran under these instructions:\n" + string(theirs, "instructions")
    request.store = False
    request.tool_choice.mode = pb.ToolChoiceMode.TOOL_CHOICE_MODE_NONE
    return request


def compacted_json(response: pb.Response) -> JSON:
    """The spec's CompactResource for the summarizing response."""
    summary = "".join(
        part.output_text.text
        for item in response.output
        if item.WhichOneof("kind") == "message"
        for part in item.message.content
        if part.WhichOneof("part") == "output_text"
    )
    compaction = {"type": "compaction", "id": new_id("cmp"), "encrypted_content": compaction_content(summary)}
    return {
        "id": response.id,
        "object": "response.compaction",
        "created_at": response.created_at.seconds,
        "output": [compaction],
        "usage": usage_json(response.usage),
    }
