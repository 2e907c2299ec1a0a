"""Per-RPC server metrics: a grpc.aio server interceptor that counts every RPC started and
handled (by its status code) and times it, in the `grpc_server_*` family of go-grpc-prometheus,
so dashboards and alerts written for gRPC servers in other languages read ours too.

The maintained Prometheus interceptors for Python (py-grpc-prometheus) intercept the
synchronous server only; OpenTelemetry's gRPC instrumentation makes spans, not these metrics.

Nothing is added per streamed message: a streaming handler is wrapped once per RPC, and an
async-generator handler becomes a coroutine that writes what it yields (what grpc's own loop over
the generator does), so the status it ends with can be read. Messages are not counted
(`grpc_server_msg_*` would cost a call per event).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

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


class RpcMetricsInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Outermost of the server's interceptors: it sees the refusals of those after it."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        # Children of the labelled metrics, looked up once per method (and code).
        self._labels: dict[tuple[str, bool, bool], tuple[str, str, str]] = {}
        self._handled: dict[tuple[tuple[str, str, str], grpc.StatusCode], Any] = {}
        self._seconds: dict[tuple[str, str, str], Any] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        started = time.perf_counter()
        handler = await continuation(details)
        if handler is None:
            return None  # an unknown method: grpc answers UNIMPLEMENTED
        shape = (handler.request_streaming, handler.response_streaming)
        behavior = _behavior(handler)
        if not (inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior)):
            return handler  # a synchronous handler (none of ours): left unmeasured
        labels = self._labels.get((details.method, *shape)) or self._learn(details.method, shape)
        self.metrics.rpc_started.labels(*labels).inc()
        finish = self._finisher(labels, started)
        wrap = _writing if inspect.isasyncgenfunction(behavior) else _awaiting
        return _MAKE[shape](
            wrap(behavior, finish),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _learn(self, method: str, shape: tuple[bool, bool]) -> tuple[str, str, str]:
        service, _, name = method.lstrip("/").rpartition("/")
        labels = (RPC_TYPES[shape], service, name)
        self._labels[(method, *shape)] = labels
        return labels

    def _finisher(self, labels: tuple[str, str, str], started: float) -> Callable[[Any, BaseException | None], None]:
        def finish(context: Any, error: BaseException | None) -> None:
            code = status_of(context, error)
            handled = self._handled.get((labels, code))
            if handled is None:
                handled = self._handled[(labels, code)] = self.metrics.rpc_handled.labels(*labels, GO_CODE_NAMES[code])
            handled.inc()
            seconds = self._seconds.get(labels)
            if seconds is None:
                seconds = self._seconds[labels] = self.metrics.rpc_seconds.labels(*labels)
            seconds.observe(time.perf_counter() - started)

        return finish


def _behavior(handler: grpc.RpcMethodHandler) -> Any:
    return handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream


def _awaiting(behavior: Any, finish: Callable[[Any, BaseException | None], None]) -> Any:
    async def measured(request: Any, context: Any) -> Any:
        try:
            result = await behavior(request, context)
        except BaseException as error:
            finish(context, error)
            raise
        finish(context, None)
        return result

    return measured


def _writing(behavior: Any, finish: Callable[[Any, BaseException | None], None]) -> Any:
    async def measured(request: Any, context: Any) -> None:
        messages = behavior(request, context)
        try:
            async for message in messages:
                await context.write(message)
        except BaseException as error:
            finish(context, error)
            raise
        finally:
            await messages.aclose()
        finish(context, None)

    return measured
