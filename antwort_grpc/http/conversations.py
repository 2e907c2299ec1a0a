"""OpenAI's /v1/conversations as JSON: bodies to the core's requests, its answers back."""

from __future__ import annotations

from antwort_grpc import pb
from antwort_grpc.http.jsonread import JSON, array, fail, obj, string
from antwort_grpc.http.mapping import item_from_json, item_json


def conversation_json(conversation: pb.Conversation) -> JSON:
    return {
        "id": conversation.id,
        "object": "conversation",
        "created_at": conversation.created_at.seconds,
        "metadata": dict(conversation.metadata),
    }


def deleted_json(conversation_id: str) -> JSON:
    return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}


def items_json(items: list[pb.Item], first_id: str, last_id: str, has_more: bool) -> JSON:
    return {
        "object": "list",
        "data": [item_json(item) for item in items],
        "first_id": first_id or None,
        "last_id": last_id or None,
        "has_more": has_more,
    }


def _metadata(value: object) -> dict[str, str]:
    if value is None:
        return {}
    return {key: string(entry, f"metadata.{key}") for key, entry in obj(value, "metadata").items()}


def _items(value: object) -> list[pb.Item]:
    return [item_from_json(entry, f"items[{n}]") for n, entry in enumerate(array(value, "items"))]


def create_conversation_request(body: object) -> pb.CreateConversationRequest:
    entry = obj(body, "body")
    _known(entry, {"items", "metadata"})
    items = _items(entry["items"]) if entry.get("items") is not None else []
    return pb.CreateConversationRequest(items=items, metadata=_metadata(entry.get("metadata")))


def update_conversation_request(conversation_id: str, body: object) -> pb.UpdateConversationRequest:
    entry = obj(body, "body")
    _known(entry, {"metadata"})
    if "metadata" not in entry:
        fail("metadata", "required: the conversation's new metadata")
    return pb.UpdateConversationRequest(conversation_id=conversation_id, metadata=_metadata(entry["metadata"]))


def add_items_request(conversation_id: str, body: object) -> pb.CreateConversationItemsRequest:
    entry = obj(body, "body")
    _known(entry, {"items"})
    if entry.get("items") is None:
        fail("items", "required: the items to add")
    return pb.CreateConversationItemsRequest(conversation_id=conversation_id, items=_items(entry["items"]))


def _known(entry: JSON, names: set[str]) -> None:
    for key in entry:
        if key not in names:
            fail(key, "unknown parameter")
