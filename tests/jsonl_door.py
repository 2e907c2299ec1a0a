"""A third door, built only from docs/engine.md's recipe ("A new front door"): every RPC of the
contract as `POST /rpc/{Method}` over HTTP, its request in protobuf's JSON, its answer as JSON
lines (one event or message per line). It proves a door is only adaptation: nothing here admits,
observes, drains, branches on background or dispatches controls."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import Message

from antwort_grpc import pb
from antwort_grpc.errors import FieldViolation, RequestError, invalid_argument
from antwort_grpc.front import Call, Front


def _decode(raw: bytes, message_class: type[Message]) -> Any:
    try:
        return json_format.Parse(raw or b"{}", message_class())
    except json_format.ParseError as err:
        raise invalid_argument([FieldViolation("body", str(err)[:200])]) from None


def _error(err: RequestError) -> dict[str, Any]:
    violations = [{"field": v.field, "description": v.description} for v in err.violations]
    return {"error": {"code": err.code.name, "message": err.message, "reason": err.reason, "violations": violations}}


class _Body:
    """A create as it arrived (front.Encoded): the core admits it by size, then it is decoded."""

    starts_response = True

    def __init__(self, raw: bytes, message_class: type[Message]) -> None:
        self.raw, self.message_class = raw, message_class

    @property
    def size(self) -> int:
        return len(self.raw)

    def too_large(self, limit: int) -> RequestError:
        return invalid_argument([FieldViolation("body", f"larger than {limit} bytes")])

    async def decode(self) -> Any:
        return _decode(self.raw, self.message_class)


class _Lines:
    """The sink: each event as a line of JSON, the response's headers sent with the first."""

    takes_wire = False

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None

    async def line(self, body: dict[str, Any]) -> None:
        if self.response is None:
            self.response = web.StreamResponse(headers={"Content-Type": "application/jsonl"})
            await self.response.prepare(self.request)
        await self.response.write(json.dumps(body).encode() + b"\n")

    async def event(self, event: pb.StreamEvent, wire: bytes | None) -> None:
        await self.line(json_format.MessageToDict(event))

    async def batch(self, events: Sequence[pb.StreamEvent], wires: Sequence[bytes]) -> None:
        for event in events:
            await self.event(event, None)

    async def logged(self, wires: Sequence[bytes], batched: bool) -> None:
        for data in wires:
            await self.event(pb.StreamEvent.FromString(data), None)


# ConversationsService: the front's verb, whether it takes the ids (else the request), and the
# field of the RPC's answer that holds what the verb returns ("": the answer is that itself).
KEPT = {
    "CreateConversation": ("create", False, "conversation"),
    "GetConversation": ("get", True, "conversation"),
    "UpdateConversation": ("update", False, "conversation"),
    "DeleteConversation": ("delete", True, ""),
    "ListConversationItems": ("list_items", False, ""),
    "CreateConversationItems": ("add_items", False, ""),
    "GetConversationItem": ("get_item", True, "item"),
    "DeleteConversationItem": ("delete_item", True, "conversation"),
}
STATUS = {"INVALID_ARGUMENT": 400, "OUT_OF_RANGE": 400, "NOT_FOUND": 404, "FAILED_PRECONDITION": 409}
STATUS |= {"RESOURCE_EXHAUSTED": 429, "UNAVAILABLE": 503, "UNAUTHENTICATED": 401}


class JsonLinesDoor:
    def __init__(self, front: Front) -> None:
        self.front = front
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, listen: str) -> None:
        app = web.Application()
        app.router.add_post("/rpc/{method}", self.handle)
        self.runner = web.AppRunner(app, handler_cancellation=True)
        await self.runner.setup()
        host, _, port = listen.rpartition(":")
        site = web.TCPSite(self.runner, host, int(port))
        await site.start()
        self.url = f"http://{host}:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    async def drain(self) -> None: ...

    def refuse(self, grace: float | None) -> None: ...

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        call = Call(method, None, [(k.lower(), v) for k, v in request.headers.items()])
        raw, lines = await request.read(), _Lines(request)
        try:
            answer = await self._call(method, call, raw, lines)
        except RequestError as err:
            if lines.response is None:
                return web.json_response(_error(err), status=STATUS.get(err.code.name, 500))
            await lines.line(_error(err))
        if answer is not None:
            return web.json_response(json_format.MessageToDict(answer))
        assert lines.response is not None
        await lines.response.write_eof()
        return lines.response

    async def _call(self, method: str, call: Call, raw: bytes, lines: _Lines) -> Message | None:
        front = self.front
        if method == "CreateResponse":
            await front.create(call, _Body(raw, pb.CreateResponseRequest), lines)
        elif method == "AttachResponse":
            attach = _decode(raw, pb.AttachResponseRequest)
            await front.attach(call, attach.response_id, attach.starting_after, lines)
        elif method == "GetResponse":
            return pb.GetResponseResponse(
                response=await front.get(call, _decode(raw, pb.GetResponseRequest).response_id)
            )
        elif method == "CancelResponse":
            cancel = _decode(raw, pb.CancelResponseRequest)
            return pb.CancelResponseResponse(response=await front.cancel(call, cancel.response_id))
        elif method == "ControlResponse":
            control = _decode(raw, pb.ControlResponseRequest)
            return pb.ControlResponseResponse(accepted=await front.control(call, control.response_id, control.control))
        elif method == "CompactConversation":
            compacted = await front.compact(call, _Body(raw, pb.CompactConversationRequest))
            made = compacted.response
            return pb.CompactConversationResponse(id=made.id, summary=compacted.item(), usage=made.usage)
        elif method in KEPT:
            verb, by_id, field = KEPT[method]
            request = _decode(raw, getattr(pb, f"{method}Request"))
            ids = [getattr(request, name) for name in ("conversation_id", "item_id") if hasattr(request, name)]
            answer = await getattr(front.conversations, verb)(call, *(ids if by_id else [request]))
            reply = getattr(pb, f"{method}Response")
            return reply(**{field: answer}) if field else answer or reply(conversation_id=ids[0], deleted=True)
        else:
            raise invalid_argument([FieldViolation("method", f"unknown method {method!r}")])
        return None
