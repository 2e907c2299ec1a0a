"""antwort.v1.ResponsesService: the gRPC door of the core (front/). It only adapts: the call's
identity and metadata into a `Call`, the request (as bytes, for a request that starts a response:
the core admits it by its size before it is decoded, decode.py), events out as stream messages
(sinks.py), RequestErrors out as statuses with details."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeAlias, TypeVar

from antwort_grpc import pb
from antwort_grpc.auth import current_identity
from antwort_grpc.errors import RequestError
from antwort_grpc.front import Call, Encoded, Front
from antwort_grpc.grpc_status import abort
from antwort_grpc.server.event_messages import ATTACH_EVENTS, CONVERSE_EVENTS, CREATE_EVENTS
from antwort_grpc.server.sinks import ConverseWriter, StreamWriter

# grpc ships no type information: the servicer context is untyped.
Context: TypeAlias = Any
T = TypeVar("T")


def call_of(method: str, context: Context) -> Call:
    """The call as the core takes it: who calls (set by the authentication interceptor), the
    metadata, the time left."""
    return Call(method, current_identity.get(), context.invocation_metadata() or (), context.time_remaining())


async def answered(context: Context, work: Awaitable[T]) -> T:
    """What `work` answers; a RequestError it raises ends the call with its status."""
    try:
        return await work
    except RequestError as err:
        await abort(context, err)
        raise AssertionError("unreachable") from err


class ResponsesServicer(pb.ResponsesServiceServicer):
    def __init__(self, front: Front) -> None:
        self.front = front

    async def CreateResponse(self, request: Encoded[pb.CreateResponseRequest], context: Context) -> None:
        # `request` arrives undecoded (decode.py): the core admits it first. Batched or not is
        # read from it by the core; the sink writes whichever it is given.
        # Not through `answered`: a coroutine less on every response's path.
        try:
            await self.front.create(call_of("CreateResponse", context), request, StreamWriter(context, CREATE_EVENTS))
        except RequestError as err:
            await abort(context, err)

    async def AttachResponse(self, request: pb.AttachResponseRequest, context: Context) -> None:
        call, sink = call_of("AttachResponse", context), StreamWriter(context, ATTACH_EVENTS)
        await answered(
            context, self.front.attach(call, request.response_id, request.starting_after, sink, request.batch_events)
        )

    async def Converse(self, requests: AsyncIterator[Encoded[pb.ConverseRequest]], context: Context) -> None:
        sink = ConverseWriter(context, CONVERSE_EVENTS)
        await answered(context, self.front.converse(call_of("Converse", context), requests, sink))

    async def ControlResponse(self, request: pb.ControlResponseRequest, context: Context) -> pb.ControlResponseResponse:
        control = self.front.control(call_of("ControlResponse", context), request.response_id, request.control)
        accepted = await answered(context, control)
        # `response` as clients built before `accepted` read it: its id and status only.
        response = pb.Response(id=accepted.response_id, status=accepted.status)
        return pb.ControlResponseResponse(response=response, accepted=accepted)

    async def GetResponse(self, request: pb.GetResponseRequest, context: Context) -> pb.GetResponseResponse:
        got = self.front.get(call_of("GetResponse", context), request.response_id)
        return pb.GetResponseResponse(response=await answered(context, got))

    async def DeleteResponse(self, request: pb.DeleteResponseRequest, context: Context) -> pb.DeleteResponseResponse:
        await answered(context, self.front.delete(call_of("DeleteResponse", context), request.response_id))
        return pb.DeleteResponseResponse(response_id=request.response_id, deleted=True)

    async def CancelResponse(self, request: pb.CancelResponseRequest, context: Context) -> pb.CancelResponseResponse:
        cancelled = self.front.cancel(call_of("CancelResponse", context), request.response_id)
        return pb.CancelResponseResponse(response=await answered(context, cancelled))

    async def ListInputItems(self, request: pb.ListInputItemsRequest, context: Context) -> pb.ListInputItemsResponse:
        page = self.front.list_input_items(
            call_of("ListInputItems", context),
            request.response_id,
            limit=request.limit,
            after=request.after,
            descending=request.order == pb.ListOrder.LIST_ORDER_DESC,
        )
        return await answered(context, page)

    async def CompactConversation(
        self, request: Encoded[pb.CompactConversationRequest], context: Context
    ) -> pb.CompactConversationResponse:
        compacted = await answered(context, self.front.compact(call_of("CompactConversation", context), request))
        response = compacted.response
        return pb.CompactConversationResponse(id=response.id, summary=compacted.item(), usage=response.usage)
