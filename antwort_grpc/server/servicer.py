"""antwort.v1.ResponsesService: the gRPC door of the core (front/). It only adapts: the call's
identity and metadata into a `Call`, the request (as bytes, for a request that starts a response:
the core admits it by its size before it is decoded, decode.py), events out as stream messages
(sinks.py), RequestErrors out as statuses with details."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, TypeAlias

from antwort_grpc import pb
from antwort_grpc.auth import current_identity
from antwort_grpc.errors import RequestError
from antwort_grpc.front import Call, Encoded, Front
from antwort_grpc.grpc_status import abort
from antwort_grpc.server.event_messages import ATTACH_EVENTS, CONVERSE_EVENTS, CREATE_EVENTS
from antwort_grpc.server.sinks import ConverseWriter, StreamWriter

# grpc ships no type information: the servicer context is untyped.
Context: TypeAlias = Any


def call_of(method: str, context: Context) -> Call:
    """The call as the core takes it: who calls (set by the authentication interceptor), the
    metadata, the time left."""
    return Call(method, current_identity.get(), context.invocation_metadata() or (), context.time_remaining())


class ResponsesServicer(pb.ResponsesServiceServicer):
    def __init__(self, front: Front) -> None:
        self.front = front

    async def CreateResponse(self, request: Encoded[pb.CreateResponseRequest], context: Context) -> None:
        # `request` arrives undecoded (decode.py): the core admits it first. Batched or not is
        # read from it by the core; the sink writes whichever it is given.
        try:
            await self.front.create(call_of("CreateResponse", context), request, StreamWriter(context, CREATE_EVENTS))
        except RequestError as err:
            await abort(context, err)

    async def AttachResponse(self, request: pb.AttachResponseRequest, context: Context) -> None:
        call, sink = call_of("AttachResponse", context), StreamWriter(context, ATTACH_EVENTS)
        try:
            await self.front.attach(call, request.response_id, request.starting_after, sink, request.batch_events)
        except RequestError as err:
            await abort(context, err)

    async def Converse(self, requests: AsyncIterator[Encoded[pb.ConverseRequest]], context: Context) -> None:
        try:
            await self.front.converse(call_of("Converse", context), requests, ConverseWriter(context, CONVERSE_EVENTS))
        except RequestError as err:
            await abort(context, err)

    async def ControlResponse(self, request: pb.ControlResponseRequest, context: Context) -> pb.ControlResponseResponse:
        try:
            call = call_of("ControlResponse", context)
            return pb.ControlResponseResponse(
                response=await self.front.control(call, request.response_id, request.control)
            )
        except RequestError as err:
            await abort(context, err)
            raise AssertionError("unreachable") from err

    async def GetResponse(self, request: pb.GetResponseRequest, context: Context) -> pb.GetResponseResponse:
        try:
            response = await self.front.get(call_of("GetResponse", context), request.response_id)
            return pb.GetResponseResponse(response=response)
        except RequestError as err:
            await abort(context, err)
            raise AssertionError("unreachable") from err

    async def DeleteResponse(self, request: pb.DeleteResponseRequest, context: Context) -> pb.DeleteResponseResponse:
        try:
            await self.front.delete(call_of("DeleteResponse", context), request.response_id)
        except RequestError as err:
            await abort(context, err)
        return pb.DeleteResponseResponse(response_id=request.response_id, deleted=True)

    async def CancelResponse(self, request: pb.CancelResponseRequest, context: Context) -> pb.CancelResponseResponse:
        try:
            response = await self.front.cancel(call_of("CancelResponse", context), request.response_id)
            return pb.CancelResponseResponse(response=response)
        except RequestError as err:
            await abort(context, err)
            raise AssertionError("unreachable") from err

    async def ListInputItems(self, request: pb.ListInputItemsRequest, context: Context) -> pb.ListInputItemsResponse:
        try:
            return await self.front.list_input_items(
                call_of("ListInputItems", context),
                request.response_id,
                limit=request.limit,
                after=request.after,
                descending=request.order == pb.ListOrder.LIST_ORDER_DESC,
            )
        except RequestError as err:
            await abort(context, err)
            raise AssertionError("unreachable") from err

    async def CompactConversation(
        self, request: Encoded[pb.CompactConversationRequest], context: Context
    ) -> pb.CompactConversationResponse:
        try:
            compacted = await self.front.compact(call_of("CompactConversation", context), request)
        except RequestError as err:
            await abort(context, err)
            raise AssertionError("unreachable") from err
        response = compacted.response
        return pb.CompactConversationResponse(id=response.id, summary=compacted.item(), usage=response.usage)
