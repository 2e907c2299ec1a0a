"""The HTTP/SSE door: the Open Responses endpoints on aiohttp's server, over the same core as the
gRPC door. It only adapts: a credential from `Authorization: Bearer` to the edge, JSON to protobuf
and back (mapping.py), RequestErrors to the spec's error object (errors.py), `pb.StreamEvent`s to
server-sent events. Validation, tenancy, limits, hooks, storage and observation are the core's.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web

from antwort_grpc import pb
from antwort_grpc.auth import AuthError, current_identity
from antwort_grpc.errors import RequestError
from antwort_grpc.front import Call, Front
from antwort_grpc.grpc_security import credential_of
from antwort_grpc.http.body import (
    BodyTooLarge,
    Limits,
    body_limit,
    read_body,
    read_compaction,
    read_create,
    read_json,
)
from antwort_grpc.http.compaction import compacted_json
from antwort_grpc.http.connections import ConnectionGate, GatedSite, connection_limits
from antwort_grpc.http.controls import ROUTED
from antwort_grpc.http.conversations import (
    add_items_request,
    conversation_json,
    create_conversation_request,
    deleted_json,
    items_json,
    update_conversation_request,
)
from antwort_grpc.http.errors import error_json, http_status, plain_error, server_log
from antwort_grpc.http.jsonread import bad, integer, obj, one_of
from antwort_grpc.http.mapping import accepted_json, input_items_json, item_json, response_json
from antwort_grpc.http.sinks import EventWriter, json_reply
from antwort_grpc.open_files import door_bounds
from antwort_grpc.startup_errors import StartupError

log = logging.getLogger(__name__)

# The request header that asks for our events beyond the spec (turns, tool execution, approvals,
# pause, injected input) as `antwort.<name>` events; without it a stream holds the spec's only.
EXTENSIONS_HEADER = "Antwort-Events"
EXTENDED = "all"
ORDERS = {"asc": False, "desc": True}
LIST_ORDERS = {False: pb.ListOrder.LIST_ORDER_ASC, True: pb.ListOrder.LIST_ORDER_DESC}
STREAM_VALUES = {"true": True, "false": False}
JSON_TYPE = "application/json"


@dataclass(frozen=True)
class DoorSettings:
    """How the door serves (config.py's ANTWORT_HTTP_* settings)."""

    # The largest request body accepted (413 past it).
    max_body_bytes: int = 32 * 1024 * 1024
    # Seconds a connection may take to send a request's headers (from its opening, or from the
    # end of the previous response on a kept-alive connection), and its body.
    idle_timeout: float = 60.0
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    # Share the port with the other workers of `serve --workers N` (SO_REUSEPORT).
    reuse_port: bool = False
    # Open connections (http/connections.py): unset, from the descriptor limit; 0: no bound.
    max_connections: int | None = None
    # Open connections from one address: unset, half the door's; 0: no bound.
    max_connections_per_peer: int | None = None
    # Seconds a connection may wait for its next request while the door is crowded (fixed; tests
    # shorten or lengthen it).
    pressure_idle_timeout: float = 1.0


class HttpDoor:
    def __init__(
        self, front: Front, settings: DoorSettings | None = None, accepting: Callable[[], bool] | None = None
    ) -> None:
        """`accepting`: whether the process still takes work (False once it drains for shutdown):
        what `/health` answers, as gRPC health goes NOT_SERVING at the same moment."""
        self.front = front
        self.accepting = accepting
        self.settings = settings or DoorSettings()
        # The most bytes a body may have (both the door's and the core's limits are fixed).
        self.body_limit = body_limit(self.settings.max_body_bytes, front.limits.max_request_bytes)
        self.runner: web.AppRunner | None = None
        self.port = 0
        self.host = ""
        self.connections: ConnectionGate | None = None

    def app(self) -> web.Application:
        app = web.Application(
            middlewares=[self._errors, self._authenticate], client_max_size=self.settings.max_body_bytes
        )
        app.router.add_post("/v1/responses", self.create)
        app.router.add_post("/v1/responses/compact", self.compact)
        app.router.add_get("/v1/responses/{id}", self.get)
        app.router.add_delete("/v1/responses/{id}", self.delete)
        app.router.add_post("/v1/responses/{id}/cancel", self.cancel)
        app.router.add_get("/v1/responses/{id}/input_items", self.input_items)
        # Our extension: the controls of a response in progress (docs/http.md).
        for name in ROUTED:
            app.router.add_post(f"/v1/responses/{{id}}/{name}", self.control)
        self._conversation_routes(app)
        app.router.add_get("/health", self.health)
        return app

    def _conversation_routes(self, app: web.Application) -> None:
        """OpenAI's /v1/conversations."""
        router = app.router
        router.add_post("/v1/conversations", self.create_conversation)
        router.add_get("/v1/conversations/{id}", self.get_conversation)
        router.add_post("/v1/conversations/{id}", self.update_conversation)
        router.add_delete("/v1/conversations/{id}", self.delete_conversation)
        router.add_get("/v1/conversations/{id}/items", self.conversation_items)
        router.add_post("/v1/conversations/{id}/items", self.add_conversation_items)
        router.add_get("/v1/conversations/{id}/items/{item_id}", self.conversation_item)
        router.add_delete("/v1/conversations/{id}/items/{item_id}", self.delete_conversation_item)

    async def start(self, listen: str) -> None:
        """Serve on `listen` (host:port; port 0: any free one)."""
        host, _, port = listen.rpartition(":")
        host = host.strip("[]") or "0.0.0.0"
        # A client that goes away cancels its handler: a response that is not background stops.
        self.runner = web.AppRunner(
            self.app(),
            handler_cancellation=True,
            access_log=None,
            keepalive_timeout=self.settings.idle_timeout,
            logger=server_log,
        )
        await self.runner.setup()
        assert self.runner.server is not None
        settings = self.settings
        limits = connection_limits(
            settings.max_connections,
            settings.max_connections_per_peer,
            door_bounds().http,
            settings.pressure_idle_timeout,
        )
        self.connections = ConnectionGate(self.runner.server, limits, self.front.refuse)
        site = GatedSite(
            self.runner,
            self.connections,
            host,
            int(port),
            ssl_context=self._tls(),
            backlog=1024,
            reuse_port=settings.reuse_port,
        )
        try:
            await site.start()
        except BaseException:
            await self.runner.cleanup()
            self.runner = None
            raise
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        self.host, self.port = host, sockets[0].getsockname()[1] if sockets else int(port)

    @property
    def url(self) -> str:
        scheme = "https" if self.settings.tls_cert is not None else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}"

    async def drain(self) -> None:
        """Nothing to do: /health answers 503 from the process root's `accepting`."""

    def refuse(self, grace: float | None) -> None:
        """Nothing to do: the core's front refuses new work (503 with Retry-After) from now."""

    async def close(self) -> None:
        await self.stop()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    def _tls(self) -> ssl.SSLContext | None:
        cert, key, client_ca = self.settings.tls_cert, self.settings.tls_key, self.settings.tls_client_ca
        if cert is None and key is None:
            return None
        if cert is None or key is None:
            raise StartupError("TLS needs both ANTWORT_TLS_CERT and ANTWORT_TLS_KEY")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(cert, key)
            if client_ca is not None:
                context.load_verify_locations(client_ca)
                context.verify_mode = ssl.CERT_REQUIRED
        except (OSError, ssl.SSLError) as err:
            raise StartupError(f"ANTWORT_TLS_*: {err}") from err
        return context

    # ------------------------------------------------------------------------- middlewares

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except RequestError as err:
            body = error_json(err)
            headers = {}
            if err.retry_after is not None:
                headers["Retry-After"] = str(max(1, round(err.retry_after)))
            return web.json_response(body, status=http_status(err), headers=headers)
        except BodyTooLarge as err:
            log.info("a request body was refused: %s", err)
            return web.json_response(plain_error(413, "request_too_large", str(err)), status=413)
        except UnicodeError as err:
            # Text a client sent (a path, a query) that is no Unicode, met where it is encoded.
            log.info("a request was refused: it holds text that is not valid Unicode (%s)", type(err).__name__)
            message = "the request holds text that is not valid Unicode (a lone surrogate)"
            return web.json_response(plain_error(400, "invalid_unicode", message), status=400)
        except web.HTTPException as err:
            if err.status < 400:
                raise
            code = _HTTP_CODES.get(err.status, "invalid_request")
            message = err.text or err.reason
            if err.status == 413:
                limit = self.settings.max_body_bytes
                message = f"the request body is larger than {limit} bytes (ANTWORT_HTTP_MAX_BODY_BYTES)"
            return web.json_response(plain_error(err.status, code, message), status=err.status)

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.front.authenticates and request.path.startswith("/v1/"):
            credential: str | AuthError
            try:
                credential = credential_of([("authorization", request.headers.get("Authorization", ""))])
            except AuthError as err:
                credential = AuthError(str(err).replace("metadata", "header"))
            if "Authorization" not in request.headers:
                credential = AuthError("no credentials: send the header 'Authorization: Bearer <credential>'")
            # The handler runs in this task: it reads who is calling from here, as gRPC's do.
            current_identity.set(await self.front.identify(credential, _method(request)))
        return await handler(request)

    # ---------------------------------------------------------------------------- handlers

    async def health(self, request: web.Request) -> web.Response:
        if self.accepting is not None and not self.accepting():
            return web.json_response({"status": "draining"}, status=503)
        return web.json_response({"status": "ok"})

    async def create(self, request: web.Request) -> web.StreamResponse:
        body = _Body(await self._body(request), read_create, self.front.limits)
        sink = EventWriter(request, _extended(request), body)
        return await sink.answered(self.front.create(self._call(request, "CreateResponse"), body, sink))

    async def compact(self, request: web.Request) -> web.Response:
        """The spec's compaction: the conversation summarized by the model into one item."""
        body = _Body(await self._body(request), read_compaction, self.front.limits)
        compacted = await self.front.compact(self._call(request, "CompactResponse"), body)
        return json_reply(compacted_json(compacted))

    async def get(self, request: web.Request) -> web.StreamResponse:
        response_id = request.match_info["id"]
        if one_of(request.query.get("stream", "false").lower(), "stream", STREAM_VALUES):
            return await self._attach(request, response_id)
        call = self._call(request, "GetResponse")
        response = await self.front.get(call, response_id)
        return json_reply(response_json(response, await self.front.logged(call, response_id)))

    async def _attach(self, request: web.Request, response_id: str) -> web.StreamResponse:
        """A background response streamed again: its events after `starting_after`, then the
        live ones to the terminal event. `starting_after` is in the client's numbering (the
        EventWriter's): the log is read from its start and counted the same way."""
        starting_after = _query_int(request.query.get("starting_after"), "starting_after")
        sink = EventWriter(request, _extended(request), None, skip=starting_after)
        call = self._call(request, "AttachResponse")
        attach = self.front.attach(call, response_id, starting_after, sink, read_from=0)
        return await sink.answered(attach)

    async def delete(self, request: web.Request) -> web.Response:
        response_id = request.match_info["id"]
        await self.front.delete(self._call(request, "DeleteResponse"), response_id)
        return web.json_response({"id": response_id, "object": "response.deleted", "deleted": True})

    async def cancel(self, request: web.Request) -> web.Response:
        response_id = request.match_info["id"]
        call = self._call(request, "CancelResponse")
        response = await self.front.cancel(call, response_id)
        return json_reply(response_json(response, await self.front.logged(call, response_id)))

    async def input_items(self, request: web.Request) -> web.Response:
        query = request.query
        limit = _query_int(query.get("limit"), "limit")
        # The spec is silent: OpenAI's default order, newest first.
        descending = one_of(query.get("order", "desc"), "order", ORDERS)
        page = await self.front.list_input_items(
            self._call(request, "ListInputItems"),
            request.match_info["id"],
            limit=limit,
            after=query.get("after", ""),
            descending=descending,
        )
        return json_reply(input_items_json(page))

    async def control(self, request: web.Request) -> web.Response:
        name = request.path.rsplit("/", 1)[1]
        limits = self.front.limits
        body = obj(await read_json(await self._body(request), limits) if request.can_read_body else {}, "body")
        control = ROUTED[name](body)
        accepted = await self.front.control(self._call(request, "ControlResponse"), request.match_info["id"], control)
        return json_reply(accepted_json(accepted))

    # ------------------------------------------------------------------- conversations

    async def _json_body(self, request: web.Request) -> object:
        """A conversation request's body: JSON within the request limits (none: an empty object)."""
        return await read_json(await self._body(request), self.front.limits) if request.can_read_body else {}

    async def create_conversation(self, request: web.Request) -> web.Response:
        body = await self._json_body(request)
        created = await self.front.conversations.create(
            self._call(request, "CreateConversation"), create_conversation_request(body)
        )
        return json_reply(conversation_json(created))

    async def get_conversation(self, request: web.Request) -> web.Response:
        call = self._call(request, "GetConversation")
        return json_reply(conversation_json(await self.front.conversations.get(call, request.match_info["id"])))

    async def update_conversation(self, request: web.Request) -> web.Response:
        update = update_conversation_request(request.match_info["id"], await self._json_body(request))
        updated = await self.front.conversations.update(self._call(request, "UpdateConversation"), update)
        return json_reply(conversation_json(updated))

    async def delete_conversation(self, request: web.Request) -> web.Response:
        conversation_id = request.match_info["id"]
        await self.front.conversations.delete(self._call(request, "DeleteConversation"), conversation_id)
        return json_reply(deleted_json(conversation_id))

    async def conversation_items(self, request: web.Request) -> web.Response:
        query = request.query
        listing = pb.ListConversationItemsRequest(
            conversation_id=request.match_info["id"],
            limit=_query_int(query.get("limit"), "limit"),
            after=query.get("after", ""),
            # OpenAI's default order: newest first.
            order=LIST_ORDERS[one_of(query.get("order", "desc"), "order", ORDERS)],
        )
        page = await self.front.conversations.list_items(self._call(request, "ListConversationItems"), listing)
        return json_reply(items_json(list(page.items), page.first_id, page.last_id, page.has_more))

    async def add_conversation_items(self, request: web.Request) -> web.Response:
        adding = add_items_request(request.match_info["id"], await self._json_body(request))
        added = await self.front.conversations.add_items(self._call(request, "CreateConversationItems"), adding)
        return json_reply(items_json(list(added.items), added.first_id, added.last_id, False))

    async def conversation_item(self, request: web.Request) -> web.Response:
        call, match = self._call(request, "GetConversationItem"), request.match_info
        item = await self.front.conversations.get_item(call, match["id"], match["item_id"])
        return json_reply(item_json(item))

    async def delete_conversation_item(self, request: web.Request) -> web.Response:
        call, match = self._call(request, "DeleteConversationItem"), request.match_info
        conversation = await self.front.conversations.delete_item(call, match["id"], match["item_id"])
        return json_reply(conversation_json(conversation))

    def _call(self, request: web.Request, method: str) -> Call:
        """The request as the core takes it: who calls (set by the middleware), its headers as
        metadata, its route as the span's HTTP attributes (built only when something observes it)."""
        door = _span_attributes(request) if self.front.observed else None
        return Call(method, current_identity.get(), _metadata(request), None, door)

    async def _body(self, request: web.Request) -> bytes:
        """The request's body, read within the idle timeout (a client that dribbles it is cut),
        and at most as large as a request may be on either door (a larger one is refused before
        the rest of it is read: BodyTooLarge, 413)."""
        try:
            async with asyncio.timeout(self.settings.idle_timeout):
                return await read_body(request, self.body_limit)
        except TimeoutError:
            raise RequestError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the request body did not arrive within {self.settings.idle_timeout:g} s (ANTWORT_HTTP_IDLE_TIMEOUT)",
                reason="body_timeout",
            ) from None


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large", 400: "invalid_request"}


def _metadata(request: web.Request) -> list[tuple[str, str]]:
    """The request's headers as the edge takes metadata (lower-case names: traceparent, …)."""
    return [(name.lower(), value) for name, value in request.headers.items()]


def _span_attributes(request: web.Request) -> dict[str, str]:
    """The response's span as an HTTP server span (OpenTelemetry's HTTP conventions)."""
    resource = request.match_info.route.resource
    return {
        "http.request.method": request.method,
        "http.route": resource.canonical if resource is not None else request.path,
        "url.scheme": request.scheme,
    }


def _method(request: web.Request) -> str:
    """The route, not the path, names a refused request in the metrics: a path holds a response's
    id, and a label of every id would grow without bound."""
    resource = request.match_info.route.resource
    return f"{request.method} {resource.canonical if resource is not None else 'unknown'}"


def _query_int(value: str | None, param: str) -> int:
    if value is None or value == "":
        return 0
    try:
        return integer(int(value), param)
    except ValueError:
        raise bad(param, f"must be an integer, not {value[:32]!r}") from None


def _extended(request: web.Request) -> bool:
    return request.headers.get(EXTENSIONS_HEADER, "").strip().lower() == EXTENDED


class _Body:
    """A body that starts a response, as it arrived (front.Encoded): the core admits it by its
    size, then it is decoded here (JSON, then the spec's mapping)."""

    __slots__ = ("decoded", "limits", "map", "raw", "size", "starts_response")

    def __init__(self, raw: bytes, read: Callable[[bytes, Limits], Awaitable[Any]], limits: Limits) -> None:
        self.raw = raw
        self.size = len(raw)
        # body.read_create or read_compaction: the JSON parsed, checked and mapped (a large
        # body in the worker process), within `limits`.
        self.map = read
        self.limits = limits
        self.starts_response = True
        self.decoded: Any = None

    def too_large(self, limit: int) -> RequestError:
        return bad("body", f"the request is {self.size} bytes, at most {limit} (ANTWORT_MAX_REQUEST_BYTES)")

    async def decode(self) -> Any:
        self.decoded = await self.map(self.raw, self.limits)
        return self.decoded
