"""Item references in a create's input, replaced by the items they name before anything starts.

An `item_reference` names an item (input or output) of one of the caller's stored responses that
has ended, or — for a create that continues a conversation — an item of that conversation (one
added to it directly included). The store finds it among that owner's responses only: another owner's item is
NOT_FOUND exactly as an id that exists nowhere. The response then holds the item itself (in its
stored input, in what the model sees), never the reference.
"""

from __future__ import annotations

import grpc

from antwort_grpc import pb
from antwort_grpc.errors import FieldViolation, RequestError, not_found
from antwort_grpc.storage.base import ItemLookup, ResponseStore


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
    if request.conversation_id and not all(item_id in found for item_id in wanted):
        found |= await _in_conversation(store, request.conversation_id, [i for i in wanted if i not in found], owner)
    missing = [(n, item_id) for n, item_id in zip(positions, wanted, strict=True) if item_id not in found]
    if missing:
        n, item_id = missing[0]
        error = not_found("item", item_id, _field(n), "no stored response of yours holds an item with this id")
        for later, other in missing[1:]:
            error.violations.append(FieldViolation(_field(later), f"item {other!r} not found"))
        raise error
    resolved = pb.CreateResponseRequest()
    resolved.CopyFrom(request)
    for n, item_id in zip(positions, wanted, strict=True):
        resolved.input_items.items[n].CopyFrom(found[item_id])
    return resolved


async def _in_conversation(
    store: ResponseStore, conversation_id: str, ids: list[str], owner: str
) -> dict[str, pb.Item]:
    """Items of the conversation the create continues, by id (added to it directly, not through
    a response); none when the store keeps no conversations or the caller has no such one."""
    conversations = getattr(store, "conversations", None)
    if conversations is None:
        return {}
    found: dict[str, pb.Item] = {}
    for item_id in dict.fromkeys(ids):
        item = await conversations.get_item(conversation_id, item_id, owner)
        if item is not None:
            found[item_id] = item
    return found


def _field(position: int) -> str:
    return f"input_items.items[{position}].item_reference.id"
