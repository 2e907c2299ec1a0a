"""The conversation resources at the front: the same for every door (it converts, this answers)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from antwort_grpc import pb
from antwort_grpc.front.call import Call
from antwort_grpc.responses.conversations import Conversations

if TYPE_CHECKING:
    from antwort_grpc.front import Front


class ConversationsFront:
    def __init__(self, front: Front) -> None:
        self.front = front

    @property
    def conversations(self) -> Conversations:
        # Read per call: the store is the responses layer's, whatever it is when a call comes.
        return Conversations(self.front.responses.store)

    async def create(self, call: Call, request: pb.CreateConversationRequest) -> pb.Conversation:
        self.front.check_open(call.method)
        return await self.conversations.create(request, call.owner)

    async def get(self, call: Call, conversation_id: str) -> pb.Conversation:
        self.front.check_open(call.method)
        return await self.conversations.get(conversation_id, call.owner)

    async def update(self, call: Call, request: pb.UpdateConversationRequest) -> pb.Conversation:
        self.front.check_open(call.method)
        return await self.conversations.update(request, call.owner)

    async def delete(self, call: Call, conversation_id: str) -> None:
        self.front.check_open(call.method)
        await self.conversations.delete(conversation_id, call.owner)

    async def list_items(
        self, call: Call, request: pb.ListConversationItemsRequest, *, descending_by_default: bool = False
    ) -> pb.ListConversationItemsResponse:
        """`descending_by_default`: the order when the request names none (OpenAI's HTTP: newest first)."""
        self.front.check_open(call.method)
        return await self.conversations.list_items(request, call.owner, descending_by_default=descending_by_default)

    async def add_items(
        self, call: Call, request: pb.CreateConversationItemsRequest
    ) -> pb.CreateConversationItemsResponse:
        self.front.check_open(call.method)
        return await self.conversations.add_items(request, call.owner)

    async def get_item(self, call: Call, conversation_id: str, item_id: str) -> pb.Item:
        self.front.check_open(call.method)
        return await self.conversations.get_item(conversation_id, item_id, call.owner)

    async def delete_item(self, call: Call, conversation_id: str, item_id: str) -> pb.Conversation:
        self.front.check_open(call.method)
        return await self.conversations.delete_item(conversation_id, item_id, call.owner)
