"""Item references in a create's input, replaced by the items they name before anything starts.

An `item_reference` names an item (input or output) of one of the caller's stored responses that
has ended, or of one of the caller's conversations (one added to it directly included; the
conversation the create continues first, when several hold the id). The store finds it among
that owner's responses and conversations only: another owner's item is NOT_FOUND exactly as an id
that exists nowhere. The response then holds the item itself (in its stored input, in what the
model sees), never the reference. A request without references reads nothing here.
"""

from __future__ import annotations

import grpc

from antwort_grpc import pb
from antwort_grpc.errors import FieldViolation, RequestError, not_found
from antwort_grpc.storage.base import ItemLookup, ResponseStore
from antwort_grpc.storage.conversations import ConversationStore


def references(request: pb.CreateResponseRequest) -> list[int]:
    """The positions of the input's item references (none for a plain-text input)."""
    if request.WhichOneof("input") != "input_items":
        return []
    return [n for n, item in enumerate(request.input_items.items) if item.WhichOneof("kind") == "item_reference"]


async def resolve_references(
    request: pb.CreateResponseRequest, positions: list[int], store: ResponseStore, owner: str
) -> pb.CreateResponseRequest:
    """A copy of `request` with the references at `positions` replaced by the items they name;
    NOT_FOUND naming every reference that names no item of `owner`'s."""
    if not isinstance(store, ItemLookup):
        raise RequestError(
            grpc.StatusCode.UNIMPLEMENTED,
            "this gateway's response store cannot look items up by id: send the items themselves",
            [FieldViolation(_field(positions[0]), "item references are not supported by this store")],
            "item_reference_unsupported",
        )
    items = request.input_items.items
    wanted = [items[n].item_reference.id for n in positions]
    found = await store.find_items(list(dict.fromkeys(wanted)), owner)
    if not all(item_id in found for item_id in wanted):
        found |= await _in_conversations(store, [i for i in wanted if i not in found], owner, request.conversation_id)
    missing = [(n, item_id) for n, item_id in zip(positions, wanted, strict=True) if item_id not in found]
    if missing:
        n, item_id = missing[0]
        error = not_found(
            "item", item_id, _field(n), "none of your stored responses or conversations holds an item with this id"
        )
        for later, other in missing[1:]:
            error.violations.append(FieldViolation(_field(later), f"item {other!r} not found"))
        raise error
    resolved = pb.CreateResponseRequest()
    resolved.CopyFrom(request)
    for n, item_id in zip(positions, wanted, strict=True):
        resolved.input_items.items[n].CopyFrom(found[item_id])
    return resolved


async def _in_conversations(store: ResponseStore, ids: list[str], owner: str, prefer: str) -> dict[str, pb.Item]:
    """Items of `owner`'s conversations, by id (`prefer`'s first); none when the store keeps no
    conversations."""
    conversations = getattr(store, "conversations", None)
    if not isinstance(conversations, ConversationStore):
        return {}
    return await conversations.find_items(list(dict.fromkeys(ids)), owner, prefer)


def _field(position: int) -> str:
    return f"input_items.items[{position}].item_reference.id"
