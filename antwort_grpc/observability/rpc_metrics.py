"""Per-RPC server metrics: every RPC started and handled (by its status code) and its handling
time, in the `grpc_server_*` family of go-grpc-prometheus, so dashboards and alerts written for
gRPC servers in other languages read ours too.

The maintained Prometheus interceptors for Python (py-grpc-prometheus) intercept the
synchronous server only; OpenTelemetry's gRPC instrumentation makes spans, not these metrics.

Not an interceptor: grpc.aio runs an interceptor per RPC through a chain of coroutines and a
method handler built for the call, about 0.1 M instructions per RPC. Instead every method's
handler is wrapped once, when the server adds it (`RpcMetrics.server`: health, reflection and the
services alike), and what runs per RPC is the wrapper's one coroutine. A call the authentication
interceptor refuses gets a handler of its own, wrapped the same (`RpcMetrics.measure`); its time
counts from the moment the interceptor saw it (`grpc_security.arrival`).

Nothing is added per streamed message: an async-generator handler becomes a coroutine that writes
what it yields (what grpc's own loop over the generator does), so the status it ends with can be
read. Messages are not counted (`grpc_server_msg_*` would cost a call per event).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Mapping, Sequence
from typing import Any

import grpc

from antwort_grpc.grpc_security import arrival
from antwort_grpc.observability.metrics import Metrics

OK = grpc.StatusCode.OK
# go-grpc-prometheus labels codes by Go's names for them (codes.Code.String()).
GO_CODE_NAMES = {
    code: "Canceled" if code is grpc.StatusCode.CANCELLED else code.name.title().replace("_", "")
    for code in grpc.StatusCode
}
GO_CODE_NAMES[OK] = "OK"
RPC_TYPES = {
    (False, False): "unary",
    (False, True): "server_stream",
    (True, False): "client_stream",
    (True, True): "bidi_stream",
}
_MAKE = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}

Handler = Any  # grpc.RpcMethodHandler: grpc ships no type information


def status_of(context: Any, error: BaseException | None) -> grpc.StatusCode:
    """The status an RPC ended with: the one it set or aborted with, else what grpc makes of how
    its handler ended (cancelled by the client or the deadline, an exception, a return)."""
    code = context.code()
    if code is not None:
        return code
    if error is None:
        return OK
    if isinstance(error, asyncio.CancelledError):
        remaining = context.time_remaining()
        expired = remaining is not None and remaining <= 0
        return grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED
    return grpc.StatusCode.UNKNOWN


class _Method:
    """The series of one method and shape, made at its first call (a method never called shows
    no series, as with the interceptor before)."""

    __slots__ = ("_handled", "_metrics", "labels", "seconds", "started")

    def __init__(self, metrics: Metrics, labels: tuple[str, str, str]) -> None:
        self._metrics = metrics
        self.labels = labels
        self.started: Any = None
        self.seconds: Any = None
        self._handled: dict[grpc.StatusCode, Any] = {}

    def start(self) -> float:
        """The call's arrival: when the first interceptor saw it, else now."""
        if self.started is None:
            self.started = self._metrics.rpc_started.labels(*self.labels)
            self.seconds = self._metrics.rpc_seconds.labels(*self.labels)
        self.started.inc()
        return arrival.get() or time.perf_counter()

    def finish(self, started: float, context: Any, error: BaseException | None) -> None:
        code = status_of(context, error)
        handled = self._handled.get(code)
        if handled is None:
            handled = self._handled[code] = self._metrics.rpc_handled.labels(*self.labels, GO_CODE_NAMES[code])
        handled.inc()
        self.seconds.observe(time.perf_counter() - started)


class RpcMetrics:
    """Wraps a server's method handlers so each RPC is counted and timed (see the module)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._methods: dict[tuple[str, bool, bool], _Method] = {}

    def measure(self, method: str, handler: Handler) -> Handler:
        """`handler` of `method` (`/package.Service/Method`), counted and timed on every call."""
        if handler is None:
            return None
        shape = (handler.request_streaming, handler.response_streaming)
        behavior = _behavior(handler)
        if not (inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior)):
            return handler  # a synchronous handler (none of ours): left unmeasured
        series = self._methods.get((method, *shape))
        if series is None:
            service, _, name = method.lstrip("/").rpartition("/")
            series = self._methods[(method, *shape)] = _Method(self.metrics, (RPC_TYPES[shape], service, name))
        wrap = _writing if inspect.isasyncgenfunction(behavior) else _awaiting
        return _MAKE[shape](
            wrap(behavior, series),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def server(self, server: grpc.aio.Server) -> grpc.aio.Server:
        """`server`, whose handlers added through this are measured (pass it to `add_…_to_server`)."""
        return _MeasuringServer(server, self)


class _MeasuringServer:
    """A grpc.aio server as the `add_…_to_server` functions see it: the handlers they add are
    wrapped (once, here) before the server gets them; anything else is the server's."""

    def __init__(self, server: grpc.aio.Server, rpc: RpcMetrics) -> None:
        self._server = server
        self._rpc = rpc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(tuple(_MeasuredGeneric(h, self._rpc) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: Mapping[str, Handler]) -> None:
        measured = {name: self._rpc.measure(f"/{service}/{name}", h) for name, h in handlers.items()}
        self._server.add_registered_method_handlers(service, measured)


class _MeasuredGeneric(grpc.GenericRpcHandler):  # type: ignore[misc]
    """A generic handler whose handlers come out measured, each wrapped at its first call."""

    def __init__(self, inner: grpc.GenericRpcHandler, rpc: RpcMetrics) -> None:
        self._inner = inner
        self._rpc = rpc
        # method -> (the inner handler, it measured)
        self._measured: dict[str, tuple[Handler, Handler]] = {}

    def service_name(self) -> str | None:
        name = getattr(self._inner, "service_name", None)
        return name() if name is not None else None

    def service(self, details: grpc.HandlerCallDetails) -> Handler:
        handler = self._inner.service(details)
        if handler is None:
            return None
        known = self._measured.get(details.method)
        if known is None or known[0] is not handler:
            known = self._measured[details.method] = (handler, self._rpc.measure(details.method, handler))
        return known[1]


def _behavior(handler: Handler) -> Any:
    return handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream


def _awaiting(behavior: Any, series: _Method) -> Any:
    async def measured(request: Any, context: Any) -> Any:
        started = series.start()
        try:
            result = await behavior(request, context)
        except BaseException as error:
            series.finish(started, context, error)
            raise
        series.finish(started, context, None)
        return result

    return measured


def _writing(behavior: Any, series: _Method) -> Any:
    async def measured(request: Any, context: Any) -> None:
        started = series.start()
        messages = behavior(request, context)
        try:
            async for message in messages:
                await context.write(message)
        except BaseException as error:
            series.finish(started, context, error)
            raise
        finally:
            await messages.aclose()
        series.finish(started, context, None)

    return measured
