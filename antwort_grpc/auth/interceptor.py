"""The gateway's authentication: a grpc.aio server interceptor.

Every RPC but the health service needs `authorization: Bearer <credential>` in its metadata when
authentication is on; the credential becomes an `Identity` in `current_identity` for the rest of
the call (the interceptor runs in the RPC's own task, so the servicer reads it there), and a
missing or bad credential is `UNAUTHENTICATED` before the servicer runs. Response-streaming RPCs
(CreateResponse, Converse) also take a slot of the principal's concurrent-response limit, answered
`RESOURCE_EXHAUSTED` when none is free.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import Any, Protocol

import grpc

from antwort_grpc.auth.identity import AuthError, Identity, current_identity
from antwort_grpc.errors import RequestError
from antwort_grpc.grpc_status import abort

# RPCs anyone may call: probes must work without credentials.
OPEN_SERVICES = ("/grpc.health.v1.Health/",)
# The RPCs that run responses, limited per principal.
LIMITED_METHODS = frozenset({"CreateResponse", "Converse"})
BEARER = "bearer "


class Authenticator(Protocol):
    async def authenticate(self, credential: str) -> Identity: ...


class ConcurrencyLimit:
    """How many responses each principal runs at once, across its connections."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running: dict[str, int] = {}

    def acquire(self, principal: str) -> bool:
        count = self.running.get(principal, 0)
        if count >= self.limit:
            return False
        self.running[principal] = count + 1
        return True

    def release(self, principal: str) -> None:
        count = self.running.get(principal, 0) - 1
        if count > 0:
            self.running[principal] = count
        else:
            self.running.pop(principal, None)


def credential_of(metadata: Collection[tuple[str, Any]] | None) -> str:
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else str(value)
            if text[: len(BEARER)].lower() != BEARER or not text[len(BEARER) :].strip():
                raise AuthError("the authorization metadata must be 'Bearer <credential>'")
            return text[len(BEARER) :].strip()
    raise AuthError("no credentials: send 'authorization: Bearer <credential>' metadata")


def _unauthenticated(message: str) -> RequestError:
    return RequestError(grpc.StatusCode.UNAUTHENTICATED, message, reason="unauthenticated")


def _replace(handler: grpc.RpcMethodHandler, behavior: Callable[..., Any]) -> grpc.RpcMethodHandler:
    """The same method with another behavior (its (de)serializers kept)."""
    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return make(
        behavior, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )


def _behavior(handler: grpc.RpcMethodHandler) -> Callable[..., Any]:
    for name in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
        behavior = getattr(handler, name)
        if behavior is not None:
            return behavior  # type: ignore[no-any-return]
    raise AssertionError("a method handler without a behavior")


def _refuse(handler: grpc.RpcMethodHandler, err: RequestError) -> grpc.RpcMethodHandler:
    if handler.response_streaming:

        async def refuse_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            await abort(context, err)
            yield  # pragma: no cover - abort raises

        return _replace(handler, refuse_stream)

    async def refuse(request: Any, context: Any) -> Any:
        await abort(context, err)

    return _replace(handler, refuse)


def _limited(handler: grpc.RpcMethodHandler, limit: ConcurrencyLimit, principal: str) -> grpc.RpcMethodHandler:
    inner = _behavior(handler)

    async def take(context: Any) -> None:
        if not limit.acquire(principal):
            await abort(
                context,
                RequestError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"at most {limit.limit} responses may run at once for one caller",
                    reason="too_many_responses",
                ),
            )

    if inspect.isasyncgenfunction(inner):

        async def run_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            await take(context)
            try:
                async for message in inner(request, context):
                    yield message
            finally:
                limit.release(principal)

        return _replace(handler, run_stream)

    # A handler that writes with context.write (the reader/writer API): wrapped the same way.
    async def run(request: Any, context: Any) -> None:
        await take(context)
        try:
            await inner(request, context)
        finally:
            limit.release(principal)

    return _replace(handler, run)


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(
        self,
        authenticator: Authenticator | None,
        limit: ConcurrencyLimit | None = None,
        open_services: tuple[str, ...] = OPEN_SERVICES,
    ) -> None:
        self.authenticator = authenticator
        self.limit = limit
        self.open_services = open_services

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method: str = details.method
        if handler is None or method.startswith(self.open_services):
            return handler
        identity = Identity("")
        if self.authenticator is not None:
            try:
                identity = await self.authenticator.authenticate(credential_of(details.invocation_metadata))
            except AuthError as err:
                return _refuse(handler, _unauthenticated(str(err)))
            # The RPC's handler runs in this task: it reads who is calling from here.
            current_identity.set(identity)
        if self.limit is not None and handler.response_streaming and method.rsplit("/", 1)[-1] in LIMITED_METHODS:
            return _limited(handler, self.limit, identity.principal)
        return handler
