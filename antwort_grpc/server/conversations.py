"""antwort.v1.ConversationsService: the gRPC door of the core's conversation resources. It only
adapts: the call into a `Call`, RequestErrors out as statuses (servicer.py's `answered`)."""

from __future__ import annotations

from antwort_grpc import pb
from antwort_grpc.front import Front
from antwort_grpc.server.servicer import Context, answered, call_of


class ConversationsServicer(pb.ConversationsServiceServicer):
    def __init__(self, front: Front) -> None:
        self.conversations = front.conversations

    async def CreateConversation(
        self, request: pb.CreateConversationRequest, context: Context
    ) -> pb.CreateConversationResponse:
        created = self.conversations.create(call_of("CreateConversation", context), request)
        return pb.CreateConversationResponse(conversation=await answered(context, created))

    async def GetConversation(self, request: pb.GetConversationRequest, context: Context) -> pb.GetConversationResponse:
        got = self.conversations.get(call_of("GetConversation", context), request.conversation_id)
        return pb.GetConversationResponse(conversation=await answered(context, got))

    async def UpdateConversation(
        self, request: pb.UpdateConversationRequest, context: Context
    ) -> pb.UpdateConversationResponse:
        updated = self.conversations.update(call_of("UpdateConversation", context), request)
        return pb.UpdateConversationResponse(conversation=await answered(context, updated))

    async def DeleteConversation(
        self, request: pb.DeleteConversationRequest, context: Context
    ) -> pb.DeleteConversationResponse:
        deleted = self.conversations.delete(call_of("DeleteConversation", context), request.conversation_id)
        await answered(context, deleted)
        return pb.DeleteConversationResponse(conversation_id=request.conversation_id, deleted=True)

    async def ListConversationItems(
        self, request: pb.ListConversationItemsRequest, context: Context
    ) -> pb.ListConversationItemsResponse:
        listed = self.conversations.list_items(call_of("ListConversationItems", context), request)
        return await answered(context, listed)

    async def CreateConversationItems(
        self, request: pb.CreateConversationItemsRequest, context: Context
    ) -> pb.CreateConversationItemsResponse:
        added = self.conversations.add_items(call_of("CreateConversationItems", context), request)
        return await answered(context, added)

    async def GetConversationItem(
        self, request: pb.GetConversationItemRequest, context: Context
    ) -> pb.GetConversationItemResponse:
        got = self.conversations.get_item(
            call_of("GetConversationItem", context), request.conversation_id, request.item_id
        )
        return pb.GetConversationItemResponse(item=await answered(context, got))

    async def DeleteConversationItem(
        self, request: pb.DeleteConversationItemRequest, context: Context
    ) -> pb.DeleteConversationItemResponse:
        deleted = self.conversations.delete_item(
            call_of("DeleteConversationItem", context), request.conversation_id, request.item_id
        )
        return pb.DeleteConversationItemResponse(conversation=await answered(context, deleted))
