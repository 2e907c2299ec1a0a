"""antwort.v1.ResponsesService: a thin layer over the engine and the store."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, TypeAlias

import grpc

from antwort_grpc import pb
from antwort_grpc.engine import Engine
from antwort_grpc.errors import FieldViolation, RequestError, invalid_argument, not_found
from antwort_grpc.responses.validation import validate_create
from antwort_grpc.status import abort
from antwort_grpc.storage.base import RUNNING, CancelSignals, ResponseStore, StoredResponse

# grpc ships no type information: the servicer context is untyped.
Context: TypeAlias = Any
S = pb.ResponseStatus

# How long CancelResponse waits for the stopped response to be stored.
CANCEL_WAIT = 10.0
# Polling the store for the end of a response cancelled on another replica: first and longest gap.
CANCEL_POLL = (0.01, 0.2)


def owner_of(context: Context) -> str:
    """Who is calling. Empty until authentication fills it in; reads filter by it already."""
    return ""


class ResponsesServicer(pb.ResponsesServiceServicer):
    def __init__(self, engine: Engine, store: ResponseStore) -> None:
        self.engine = engine
        self.store = store

    async def CreateResponse(
        self, request: pb.CreateResponseRequest, context: Context
    ) -> AsyncIterator[pb.CreateResponseResponse]:
        violations = validate_create(request)
        if violations:
            await abort(context, invalid_argument(violations))
        events = self.engine.run(request, owner=owner_of(context), timeout=context.time_remaining())
        try:
            first = await anext(events)
        except RequestError as err:
            await abort(context, err)
            return
        if request.stream:
            yield _message(first)
            async for event in events:
                yield _message(event)
        else:
            # One code path: drain the same stream, send only the terminal event.
            last = first
            async for event in events:
                last = event
            yield _message(last)

    async def GetResponse(self, request: pb.GetResponseRequest, context: Context) -> pb.GetResponseResponse:
        response_id = await _required_id(request.response_id, context)
        owner = owner_of(context)
        record = await self.store.get(response_id, owner)
        if record is None:
            running = self.engine.runs.get(response_id, owner)
            if running is None:
                await abort(context, not_found("response", response_id, "response_id"))
                raise AssertionError("unreachable")
            return pb.GetResponseResponse(response=running.response)
        return pb.GetResponseResponse(response=record.response)

    async def DeleteResponse(self, request: pb.DeleteResponseRequest, context: Context) -> pb.DeleteResponseResponse:
        response_id = await _required_id(request.response_id, context)
        if not await self.store.delete(response_id, owner_of(context)):
            await abort(context, not_found("response", response_id, "response_id"))
        return pb.DeleteResponseResponse(response_id=response_id, deleted=True)

    async def CancelResponse(self, request: pb.CancelResponseRequest, context: Context) -> pb.CancelResponseResponse:
        response_id = await _required_id(request.response_id, context)
        owner = owner_of(context)
        handle = self.engine.runs.get(response_id, owner)
        if handle is not None:
            handle.stop("cancelled")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CANCEL_WAIT):
                    await handle.done.wait()
            record = await self.store.get(response_id, owner)
            return pb.CancelResponseResponse(response=record.response if record else handle.response)
        record = await self.store.get(response_id, owner)
        if record is None:
            await abort(context, not_found("response", response_id, "response_id"))
            raise AssertionError("unreachable")
        signals = self.store if isinstance(self.store, CancelSignals) else None
        # It runs on another replica: the store carries the request there; wait for its end.
        if record.response.status in RUNNING and signals and await signals.request_cancel(response_id, owner):
            ended = await self._await_end(response_id, owner)
            if ended is not None and ended.response.status not in RUNNING:
                # Cancelled, or ended some other way while the request travelled.
                return pb.CancelResponseResponse(response=ended.response)
        status = record.response.status
        if status == S.RESPONSE_STATUS_CANCELLED:
            return pb.CancelResponseResponse(response=record.response)
        if status in RUNNING:
            await abort(
                context,
                RequestError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"response {response_id!r} runs on another gateway replica that did not stop it "
                    f"within {CANCEL_WAIT:.0f}s",
                    reason="cancel_unreachable",
                ),
            )
        await abort(
            context,
            RequestError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"response {response_id!r} already ended with status {S.Name(status)}",
                [FieldViolation("response_id", "the response is not in progress")],
                "not_in_progress",
            ),
        )
        raise AssertionError("unreachable")

    async def _await_end(self, response_id: str, owner: str) -> StoredResponse | None:
        """The stored response once it has left the running statuses (or as it is at the timeout)."""
        delay, longest = CANCEL_POLL
        record = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CANCEL_WAIT):
                while True:
                    record = await self.store.get(response_id, owner)
                    if record is None or record.response.status not in RUNNING:
                        return record
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, longest)
        return record

    async def ListInputItems(self, request: pb.ListInputItemsRequest, context: Context) -> pb.ListInputItemsResponse:
        response_id = await _required_id(request.response_id, context)
        limit = request.limit or 20
        if not 1 <= limit <= 100:
            await abort(context, invalid_argument([FieldViolation("limit", "must be between 1 and 100")]))
        page = await self.store.list_input_items(
            response_id,
            limit=limit,
            after=request.after,
            descending=request.order == pb.ListOrder.LIST_ORDER_DESC,
            owner=owner_of(context),
        )
        if page is None:
            await abort(context, not_found("response", response_id, "response_id"))
            raise AssertionError("unreachable")
        items = page.items
        return pb.ListInputItemsResponse(
            items=items,
            first_id=items[0].id if items else "",
            last_id=items[-1].id if items else "",
            has_more=page.has_more,
        )


def _message(event: pb.StreamEvent) -> pb.CreateResponseResponse:
    # CopyFrom into an empty message costs half of CreateResponseResponse(event=event), once
    # per streamed event.
    message = pb.CreateResponseResponse()
    message.event.CopyFrom(event)
    return message


async def _required_id(response_id: str, context: Context) -> str:
    if not response_id:
        await abort(context, invalid_argument([FieldViolation("response_id", "required")]))
    return response_id
