"""The gateway's authentication at its gRPC door: a grpc.aio server interceptor.

Every RPC but the health service needs `authorization: Bearer <credential>` in its metadata when
authentication is on. The interceptor only reads the credential; the Authenticator (API keys,
JWTs, a shared token) says who it names — the same one every door of the gateway uses. The
Identity is put in `current_identity` for the rest of the call (the interceptor runs in the RPC's
own task, so the servicer reads it there); a missing or bad credential is `UNAUTHENTICATED` before
the servicer runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import Any

import grpc

from antwort_grpc.auth.identity import Authenticator, AuthError, current_identity
from antwort_grpc.errors import RequestError
from antwort_grpc.grpc_status import abort

# RPCs anyone may call: probes must work without credentials.
OPEN_SERVICES = ("/grpc.health.v1.Health/",)
BEARER = "bearer "


def credential_of(metadata: Collection[tuple[str, Any]] | None) -> str:
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else str(value)
            if text[: len(BEARER)].lower() != BEARER or not text[len(BEARER) :].strip():
                raise AuthError("the authorization metadata must be 'Bearer <credential>'")
            return text[len(BEARER) :].strip()
    raise AuthError("no credentials: send 'authorization: Bearer <credential>' metadata")


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


def _refuse(handler: grpc.RpcMethodHandler, err: RequestError) -> grpc.RpcMethodHandler:
    if handler.response_streaming:

        async def refuse_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            await abort(context, err)
            yield  # pragma: no cover - abort raises

        return _replace(handler, refuse_stream)

    async def refuse(request: Any, context: Any) -> Any:
        await abort(context, err)

    return _replace(handler, refuse)


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(
        self,
        authenticator: Authenticator,
        open_services: tuple[str, ...] = OPEN_SERVICES,
        refused: Callable[[str, RequestError], None] | None = None,
    ) -> None:
        self.authenticator = authenticator
        self.open_services = open_services
        # Told of each call refused here (the method's name, the error): the gateway counts them.
        self.refused = refused

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method: str = details.method
        if handler is None or method.startswith(self.open_services):
            return handler
        try:
            identity = await self.authenticator.authenticate(credential_of(details.invocation_metadata))
        except AuthError as err:
            refusal = RequestError(grpc.StatusCode.UNAUTHENTICATED, str(err), reason="unauthenticated")
            if self.refused is not None:
                self.refused(method.rpartition("/")[2], refusal)
            return _refuse(handler, refusal)
        # The RPC's handler runs in this task: it reads who is calling from here.
        current_identity.set(identity)
        return handler
