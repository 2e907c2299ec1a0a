"""Conversations: what every door does with the conversation resources, and the checks of a
create that names one.

A conversation is a list of items a response starts from (`conversation_id` on create): its
items are the history, as a previous_response_id chain's are, and the response's input and
output are appended when it ends (engine/loop.py). Owner-scoped: another owner's conversation is
NOT_FOUND, exactly as one that does not exist.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import grpc

from antwort_grpc import pb
from antwort_grpc.engine.request import input_items
from antwort_grpc.errors import FieldViolation, RequestError, invalid_argument, not_found
from antwort_grpc.ids import new_id
from antwort_grpc.responses.pages import item_list, page_limit
from antwort_grpc.responses.validation import check_id, check_item
from antwort_grpc.storage.conversations import ConversationStore, Entry

# OpenAI's bounds: items per create or add, and the metadata's pairs and sizes.
MAX_ITEMS = 20
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512


def check_conversation(request: pb.CreateResponseRequest) -> list[FieldViolation]:
    """A create's conversation: an id, never with previous_response_id (OpenAI refuses both)."""
    if not request.conversation_id:
        return []
    v: list[FieldViolation] = []
    if request.previous_response_id:
        v.append(
            FieldViolation(
                "conversation_id",
                "mutually exclusive with previous_response_id: continue a conversation or a response, not both",
            )
        )
    check_id("conversation_id", request.conversation_id, v)
    return v


def conversations_of(store: object) -> ConversationStore:
    """The store's conversations; UNIMPLEMENTED when it keeps none."""
    conversations = getattr(store, "conversations", None)
    if not isinstance(conversations, ConversationStore):
        raise RequestError(
            grpc.StatusCode.UNIMPLEMENTED,
            "this gateway's response store keeps no conversations",
            reason="conversations_unsupported",
        )
    return conversations


class Conversations:
    def __init__(self, store: object) -> None:
        self.store = store

    @property
    def kept(self) -> ConversationStore:
        return conversations_of(self.store)

    async def create(self, request: pb.CreateConversationRequest, owner: str) -> pb.Conversation:
        v = _metadata_problems(request.metadata)
        items = _new_items(request.items, "items", v)
        if v:
            raise invalid_argument(v)
        conversation = pb.Conversation(id=new_id("conv"), metadata=request.metadata)
        conversation.created_at.FromNanoseconds(time.time_ns())
        await self.kept.create(conversation, items, owner)
        return conversation

    async def get(self, conversation_id: str, owner: str) -> pb.Conversation:
        _require_id(conversation_id)
        conversation = await self.kept.get(conversation_id, owner)
        if conversation is None:
            raise _missing(conversation_id)
        return conversation

    async def update(self, request: pb.UpdateConversationRequest, owner: str) -> pb.Conversation:
        _require_id(request.conversation_id)
        v = _metadata_problems(request.metadata)
        if v:
            raise invalid_argument(v)
        conversation = await self.kept.update(request.conversation_id, request.metadata, owner)
        if conversation is None:
            raise _missing(request.conversation_id)
        return conversation

    async def delete(self, conversation_id: str, owner: str) -> None:
        _require_id(conversation_id)
        if not await self.kept.delete(conversation_id, owner):
            raise _missing(conversation_id)

    async def list_items(
        self, request: pb.ListConversationItemsRequest, owner: str, *, descending_by_default: bool = False
    ) -> pb.ListConversationItemsResponse:
        _require_id(request.conversation_id)
        limit = page_limit(request.limit)
        order = request.order
        descending = order == pb.ListOrder.LIST_ORDER_DESC or (
            order == pb.ListOrder.LIST_ORDER_UNSPECIFIED and descending_by_default
        )
        page = await self.kept.list_items(
            request.conversation_id, limit=limit, after=request.after, descending=descending, owner=owner
        )
        if page is None:
            raise _missing(request.conversation_id)
        return item_list(pb.ListConversationItemsResponse, page.items, page.has_more)

    async def add_items(
        self, request: pb.CreateConversationItemsRequest, owner: str
    ) -> pb.CreateConversationItemsResponse:
        _require_id(request.conversation_id)
        v: list[FieldViolation] = []
        if not request.items:
            v.append(FieldViolation("items", "required: 1 to 20 items"))
        items = _new_items(request.items, "items", v)
        if v:
            raise invalid_argument(v)
        if not await self.kept.append(request.conversation_id, [Entry(item) for item in items], owner):
            raise _missing(request.conversation_id)
        return item_list(pb.CreateConversationItemsResponse, items)

    async def get_item(self, conversation_id: str, item_id: str, owner: str) -> pb.Item:
        _require_id(conversation_id, item_id)
        item = await self.kept.get_item(conversation_id, item_id, owner)
        if item is None:
            await self.get(conversation_id, owner)  # NOT_FOUND naming the conversation, if it is that
            raise not_found("item", item_id, "item_id", "no item of the conversation has this id")
        return item

    async def delete_item(self, conversation_id: str, item_id: str, owner: str) -> pb.Conversation:
        _require_id(conversation_id, item_id)
        if not await self.kept.delete_item(conversation_id, item_id, owner):
            await self.get(conversation_id, owner)
            raise not_found("item", item_id, "item_id", "no item of the conversation has this id")
        return await self.get(conversation_id, owner)


def _new_items(items: Sequence[pb.Item], at: str, v: list[FieldViolation]) -> list[pb.Item]:
    """The items with ids (and a status) as a response's input gets them, checked as input is."""
    if len(items) > MAX_ITEMS:
        v.append(FieldViolation(at, f"at most {MAX_ITEMS} items (this request has {len(items)})"))
        return []
    for n, item in enumerate(items):
        check_item(item, f"{at}[{n}]", v)
        if item.WhichOneof("kind") == "item_reference":
            v.append(FieldViolation(f"{at}[{n}].item_reference", "a conversation keeps items, not references to them"))
    return input_items(pb.CreateResponseRequest(input_items=pb.ItemList(items=items)))


def _metadata_problems(metadata: Mapping[str, str]) -> list[FieldViolation]:
    v: list[FieldViolation] = []
    if len(metadata) > MAX_METADATA_PAIRS:
        v.append(FieldViolation("metadata", f"at most {MAX_METADATA_PAIRS} pairs"))
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY:
            v.append(FieldViolation("metadata", f"a key is at most {MAX_METADATA_KEY} characters"))
        if len(value) > MAX_METADATA_VALUE:
            v.append(FieldViolation(f"metadata.{key[:64]}", f"at most {MAX_METADATA_VALUE} characters"))
    return v


def _require_id(conversation_id: str, item_id: str | None = None) -> None:
    v = [] if conversation_id else [FieldViolation("conversation_id", "required")]
    check_id("conversation_id", conversation_id, v)
    if item_id is not None:
        if not item_id:
            v.append(FieldViolation("item_id", "required"))
        check_id("item_id", item_id, v)
    if v:
        raise invalid_argument(v)


def _missing(conversation_id: str) -> RequestError:
    return not_found("conversation", conversation_id, "conversation_id")
