"""The HTTP/SSE door: the Open Responses endpoints on aiohttp's server, over the same core as the
gRPC door. It only adapts: a credential from `Authorization: Bearer` to the edge, JSON to protobuf
and back (mapping.py), RequestErrors to the spec's error object (errors.py), `pb.StreamEvent`s to
server-sent events. Validation, tenancy, limits, hooks, storage and observation are the core's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
from aiohttp import web

from antwort_grpc import pb
from antwort_grpc.auth import AuthError, current_identity, current_owner
from antwort_grpc.core import Core
from antwort_grpc.edge import Reservation, Watch
from antwort_grpc.errors import RequestError
from antwort_grpc.grpc_security import credential_of
from antwort_grpc.hooks.service import Caller
from antwort_grpc.http.compaction import compacted_json, compaction_request
from antwort_grpc.http.durable import (
    attached,
    begun_events,
    durability,
    keep_until_run_ends,
    wants_durable,
)
from antwort_grpc.http.errors import error_json, http_status, plain_error
from antwort_grpc.http.jsonread import bad, boolean, integer, obj, one_of, string
from antwort_grpc.http.mapping import (
    TERMINAL,
    create_request,
    event_json,
    input_items_json,
    item_from_json,
    response_json,
    sse,
)
from antwort_grpc.responses.durable import Begun, Durability, idempotency_key
from antwort_grpc.startup_errors import StartupError

log = logging.getLogger(__name__)

# The request header that asks for our events beyond the spec (turns, tool execution, approvals,
# pause, injected input) as `antwort.<name>` events; without it a stream holds the spec's only.
EXTENSIONS_HEADER = "Antwort-Events"
EXTENDED = "all"
ORDERS = {"asc": False, "desc": True}
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


class HttpDoor:
    def __init__(
        self, core: Core, settings: DoorSettings | None = None, accepting: Callable[[], bool] | None = None
    ) -> None:
        """`accepting`: whether the process still takes work (False once it drains for shutdown):
        what `/health` answers, as gRPC health goes NOT_SERVING at the same moment."""
        self.core = core
        self.accepting = accepting
        self.responses = core.responses
        self.edge = core.edge
        self.settings = settings or DoorSettings()
        self.runner: web.AppRunner | None = None
        self.port = 0
        self.host = ""

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
        for name in CONTROLS:
            app.router.add_post(f"/v1/responses/{{id}}/{name}", self.control)
        app.router.add_get("/health", self.health)
        return app

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
        )
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, int(port), ssl_context=self._tls(), backlog=1024)
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
        if self.edge.authenticates and request.path.startswith("/v1/"):
            credential: str | AuthError
            try:
                credential = credential_of([("authorization", request.headers.get("Authorization", ""))])
            except AuthError as err:
                credential = AuthError(str(err).replace("metadata", "header"))
            if "Authorization" not in request.headers:
                credential = AuthError("no credentials: send the header 'Authorization: Bearer <credential>'")
            # The handler runs in this task: it reads who is calling from here, as gRPC's do.
            current_identity.set(await self.edge.identify(credential, _method(request)))
        return await handler(request)

    # ---------------------------------------------------------------------------- handlers

    async def health(self, request: web.Request) -> web.Response:
        if self.accepting is not None and not self.accepting():
            return web.json_response({"status": "draining"}, status=503)
        return web.json_response({"status": "ok"})

    async def create(self, request: web.Request) -> web.StreamResponse:
        raw = await self._body(request)
        reserved = self._reserve(raw, "CreateResponse")
        # A background run takes the room over (released when it ends, not with this request).
        kept = False
        try:
            create = self._parsed("CreateResponse", lambda: create_request(_json(raw)))
            extended = request.headers.get(EXTENSIONS_HEADER, "").strip().lower() == EXTENDED
            metadata = _metadata(request)
            door = _span_attributes(request)
            async with self.edge.stream("CreateResponse", current_identity.get(), metadata, door) as watch:
                if wants_durable(create.background, metadata):
                    durable = durability(self.responses)
                    owner = current_owner()
                    begun = await durable.begin(
                        create.request, owner=owner, key=idempotency_key(metadata), caller=self._caller(metadata)
                    )
                    kept = keep_until_run_ends(reserved, begun, watch)
                    return await self._answer_begun(request, durable, begun, create.stream, watch, extended)
                with self.edge.response(len(raw), reserved):
                    events = await self._start(create.request, metadata)
                    try:
                        if create.stream:
                            return await self._stream(request, events, watch, extended)
                        return web.json_response(response_json(await self._drain(events, watch)), dumps=_dumps)
                    finally:
                        await events.aclose()
        finally:
            if not kept:
                _release(reserved)

    async def _answer_begun(
        self, request: web.Request, durable: Durability, begun: Begun, stream: bool, watch: Watch, extended: bool
    ) -> web.StreamResponse:
        """A background or idempotent create's answer (the gRPC door's, in JSON): streaming, its
        events (a background one's from its log, which a dropped client leaves running);
        else the response as it stands (a background one: queued or in progress)."""
        owner = current_owner()
        background = begun.logged
        events = begun_events(durable, begun, stream, owner)
        try:
            if stream:
                if background:
                    await durable.attach_check(begun.response_id, owner, 0)
                return await self._stream(request, events, watch, extended, background)
            last = None
            async for event in events:
                if watch.observing:
                    watch.saw(event)
                last = event
            assert last is not None
            watch.ended()
            answer: pb.Response = getattr(last, str(last.WhichOneof("event"))).response
            return web.json_response(response_json(answer, background), dumps=_dumps)
        finally:
            await events.aclose()

    async def compact(self, request: web.Request) -> web.Response:
        """The spec's compaction: the conversation summarized by the model into one item."""
        raw = await self._body(request)
        reserved = self._reserve(raw, "CompactResponse")
        try:
            summarize = self._parsed("CompactResponse", lambda: compaction_request(_json(raw)))
            metadata = _metadata(request)
            door = _span_attributes(request)
            async with self.edge.stream("CompactResponse", current_identity.get(), metadata, door) as watch:
                with self.edge.response(len(raw), reserved):
                    events = await self._start(summarize, metadata)
                    try:
                        response = await self._drain(events, watch)
                    finally:
                        await events.aclose()
        finally:
            _release(reserved)
        if response.status != pb.ResponseStatus.RESPONSE_STATUS_COMPLETED:
            raise RequestError(
                grpc.StatusCode.UNAVAILABLE,
                f"the conversation could not be summarized: {response.error.message or 'the response ended early'}",
                reason=response.error.code or "compaction_failed",
            )
        return web.json_response(compacted_json(response), dumps=_dumps)

    def _reserve(self, raw: bytes, method: str) -> Reservation:
        """Room for a response of this request, taken by its size before it is parsed, as on the
        gRPC door: parsing makes several times its bytes in objects, which a refused request
        should not have cost."""
        try:
            return self.edge.admission.reserve(len(raw))
        except RequestError as err:
            self.edge.refused(method, err)
            raise

    def _parsed(self, method: str, parse: Callable[[], T]) -> T:
        try:
            return parse()
        except RequestError as err:
            # Counted as the gRPC door counts a request that does not parse.
            self.edge.refused(method, err)
            raise

    async def _start(self, create: pb.CreateResponseRequest, metadata: list[tuple[str, str]]) -> Events:
        run = await self.responses.create(create, owner=current_owner(), caller=self._caller(metadata))
        return run.events()

    def _caller(self, metadata: list[tuple[str, str]]) -> Caller | None:
        """Who calls, for the hook services (None: no hooks to tell)."""
        if not self.responses.hooked:
            return None
        return dataclasses.replace(Caller.from_metadata(metadata), owner=current_owner())

    async def _drain(self, events: Events, watch: Watch) -> pb.Response:
        """Non-streaming: the same events drained; the terminal one's response."""
        last = None
        observing = watch.observing
        async for event in events:
            if observing:
                watch.saw(event)
            last = event
        assert last is not None
        watch.ended()
        kind = last.WhichOneof("event")
        assert kind in TERMINAL
        response: pb.Response = getattr(last, kind).response
        return response

    async def _stream(
        self,
        request: web.Request,
        events: AsyncIterator[pb.StreamEvent],
        watch: Watch,
        extended: bool,
        background: bool = False,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
        await response.prepare(request)
        observing = watch.observing
        number = 0
        try:
            async for event in events:
                if observing:
                    watch.saw(event)
                number = event.sequence_number
                body = event_json(event, extended, background)
                if body is not None:
                    await response.write(sse(body))
            watch.ended()
        except ConnectionError:
            # The client went away between two events: the run is closed with the events (it
            # stops, and is stored with its final status; a background one goes on, only its
            # log's reading stops), nobody is left to write to.
            return response
        except Exception as err:
            # After the headers went out an error can only be an event (the spec's `error`): the
            # core's own (a background response's log removed while it was read) as it is.
            failure = err if isinstance(err, RequestError) else None
            if failure is None:
                log.exception("the stream of a response failed")
                failure = RequestError(grpc.StatusCode.INTERNAL, f"the stream failed: {type(err).__name__}")
            payload = error_json(failure)["error"]
            with contextlib.suppress(ConnectionError):
                await response.write(sse({"type": "error", "sequence_number": number + 1, "error": payload}))
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        return response

    async def get(self, request: web.Request) -> web.StreamResponse:
        response_id = request.match_info["id"]
        owner = current_owner()
        if one_of(request.query.get("stream", "false").lower(), "stream", STREAM_VALUES):
            return await self._attach(request, response_id, owner)
        response = await self.responses.get(response_id, owner)
        return web.json_response(response_json(response, await self._logged(response_id, owner)), dumps=_dumps)

    async def _attach(self, request: web.Request, response_id: str, owner: str) -> web.StreamResponse:
        """A background response streamed again: its events after `starting_after`, then the
        live ones to the terminal event — AttachResponse's reading, the same sequence numbers."""
        starting_after = _query_int(request.query.get("starting_after"), "starting_after")
        extended = request.headers.get(EXTENSIONS_HEADER, "").strip().lower() == EXTENDED
        metadata = _metadata(request)
        # It reads a run that counts already: no slot of the principal's limit (as AttachResponse).
        async with self.edge.stream(
            "AttachResponse", current_identity.get(), metadata, _span_attributes(request), limited=False
        ) as watch:
            durable = durability(self.responses)
            # Checked before the headers go out: a bad attach is an error object, not a stream.
            await durable.attach_check(response_id, owner, starting_after)
            events = attached(durable, response_id, owner, starting_after)
            try:
                return await self._stream(request, events, watch, extended, background=True)
            finally:
                await events.aclose()

    async def _logged(self, response_id: str, owner: str) -> bool:
        """Whether a response was created in background (its event log is kept)."""
        durable = self.responses.durable
        return durable is not None and await durable.runlog.state(response_id, owner) is not None

    async def delete(self, request: web.Request) -> web.Response:
        response_id = request.match_info["id"]
        await self.responses.delete(response_id, current_owner())
        return web.json_response({"id": response_id, "object": "response.deleted", "deleted": True})

    async def cancel(self, request: web.Request) -> web.Response:
        response_id = request.match_info["id"]
        owner = current_owner()
        response = await self.responses.cancel(response_id, owner)
        return web.json_response(response_json(response, await self._logged(response_id, owner)), dumps=_dumps)

    async def input_items(self, request: web.Request) -> web.Response:
        query = request.query
        limit = _query_int(query.get("limit"), "limit")
        # The spec is silent: OpenAI's default order, newest first.
        descending = one_of(query.get("order", "desc"), "order", ORDERS)
        page = await self.responses.list_input_items(
            request.match_info["id"],
            limit=limit,
            after=query.get("after", ""),
            descending=descending,
            owner=current_owner(),
        )
        return web.json_response(input_items_json(page), dumps=_dumps)

    async def control(self, request: web.Request) -> web.Response:
        name = request.path.rsplit("/", 1)[1]
        body = obj(_json(await self._body(request)) if request.can_read_body else {}, "body")
        control = CONTROLS[name](body)
        response = await self.responses.control(request.match_info["id"], control, current_owner())
        return web.json_response(response_json(response), dumps=_dumps)

    async def _body(self, request: web.Request) -> bytes:
        """The request's body, read within the idle timeout (a client that dribbles it is cut)."""
        try:
            async with asyncio.timeout(self.settings.idle_timeout):
                return await request.read()
        except TimeoutError:
            raise RequestError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the request body did not arrive within {self.settings.idle_timeout:g} s (ANTWORT_HTTP_IDLE_TIMEOUT)",
                reason="body_timeout",
            ) from None


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Events = AsyncGenerator[pb.StreamEvent, None]
T = TypeVar("T")

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large", 400: "invalid_request"}


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _json(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise bad("body", f"not valid JSON: {err}") from None


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


def _release(reserved: Reservation) -> None:
    # Taken over by the response when it started (then already released); else given back here.
    reserved.release()


def _query_int(value: str | None, param: str) -> int:
    if value is None or value == "":
        return 0
    try:
        return integer(int(value), param)
    except ValueError:
        raise bad(param, f"must be an integer, not {value[:32]!r}") from None


# ------------------------------------------------------------------------ extension controls


def _items(body: dict[str, Any]) -> list[pb.Item]:
    value = body.get("input")
    if isinstance(value, str):
        part = pb.ContentPart(input_text=pb.InputText(text=value))
        return [pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[part]))]
    if not isinstance(value, list):
        raise bad("input", "required: a string, or an array of input items")
    return [item_from_json(entry, f"input[{n}]") for n, entry in enumerate(value)]


def _steer(body: dict[str, Any]) -> pb.Control:
    return pb.Control(steer=pb.SteerControl(items=_items(body)))


def _follow_up(body: dict[str, Any]) -> pb.Control:
    return pb.Control(follow_up=pb.FollowUpControl(items=_items(body)))


def _approval(body: dict[str, Any]) -> pb.Control:
    decision = pb.ApprovalResponse(
        call_id=string(body.get("approval_request_id"), "approval_request_id"),
        approve=boolean(body.get("approve"), "approve"),
        reason=string(body.get("reason", ""), "reason"),
    )
    return pb.Control(approval=decision)


def _pause(body: dict[str, Any]) -> pb.Control:
    return pb.Control(pause=pb.PauseControl(reason=string(body.get("reason", ""), "reason")))


def _resume(body: dict[str, Any]) -> pb.Control:
    return pb.Control(resume=pb.ResumeControl())


CONTROLS: dict[str, Callable[[dict[str, Any]], pb.Control]] = {
    "steer": _steer,
    "follow_up": _follow_up,
    "approval": _approval,
    "pause": _pause,
    "resume": _resume,
}
