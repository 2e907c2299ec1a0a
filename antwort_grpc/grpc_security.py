"""Who may call a gRPC server of this package: TLS from PEM files, and a bearer credential checked
by an interceptor before any servicer runs.

The gateway (its `server/` and `auth/` packages) and the separate tool programs (`tool_services/`:
the sandbox, the MCP bridge, your own executor) are all served this way, so both import this
module and neither imports the other. What a credential means is the Authenticator's business: API
keys and JWTs for the gateway (`auth/`), one shared token for an executor (`tool_services/security`).

Every RPC but the health service needs `authorization: Bearer <credential>` in its metadata when
an interceptor is installed. The Identity the credential names is put in `current_identity` for
the rest of the call (the interceptor runs in the RPC's own task, so the servicer reads it there);
a missing or bad credential is `UNAUTHENTICATED` before the servicer runs.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc

from antwort_grpc.errors import RequestError
from antwort_grpc.grpc_status import abort
from antwort_grpc.startup_errors import StartupError

log = logging.getLogger(__name__)

# RPCs anyone may call: probes must work without credentials.
OPEN_SERVICES = ("/grpc.health.v1.Health/",)
BEARER = "bearer "


@dataclass(frozen=True, slots=True)
class Identity:
    principal: str
    tenant: str = ""

    @property
    def owner(self) -> str:
        """The owner recorded on stored responses: the tenant when the credential names one (every
        principal of a tenant sees the tenant's responses), else the principal alone. Prefixed so a
        tenant and a principal of the same name never share responses."""
        return f"tenant:{self.tenant}" if self.tenant else f"principal:{self.principal}"


class AuthError(Exception):
    """A credential is missing, malformed, expired or unknown; the message says which, never
    echoing the credential."""


class Authenticator(Protocol):
    """API keys, JWTs or a shared token: the Identity a credential names, AuthError when it names none."""

    async def authenticate(self, credential: str) -> Identity: ...


# None: no authentication configured, or outside an RPC.
current_identity: ContextVar[Identity | None] = ContextVar("current_identity", default=None)
# perf_counter() when the RPC reached the authentication interceptor (0.0: it has none), so the
# per-RPC metrics time a call from its arrival, authentication included.
arrival: ContextVar[float] = ContextVar("rpc_arrival", default=0.0)


def credential_of(metadata: Collection[tuple[str, Any]] | None) -> str:
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else str(value)
            if text[: len(BEARER)].lower() != BEARER or not text[len(BEARER) :].strip():
                raise AuthError("the authorization metadata must be 'Bearer <credential>'")
            return text[len(BEARER) :].strip()
    raise AuthError("no credentials: send 'authorization: Bearer <credential>' metadata")


async def identify(authenticator: Authenticator, credential: str) -> Identity:
    """The Identity the credential names; AuthError for every credential that names none.

    A credential is whatever a caller sends, so an authenticator that fails on one in a way it did
    not foresee (a library's TypeError on a token it cannot parse) still refuses it: the caller
    gets UNAUTHENTICATED and the log one line naming the failure, never a traceback per call."""
    try:
        return await authenticator.authenticate(credential)
    except AuthError:
        raise
    except Exception as err:
        log.warning("a credential could not be checked (%s: %s); the call is refused", type(err).__name__, err)
        raise AuthError("the credential could not be checked") from None


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
        measure: Callable[[str, grpc.RpcMethodHandler], grpc.RpcMethodHandler] | None = None,
    ) -> None:
        self.authenticator = authenticator
        self.open_services = open_services
        # Told of each call refused here (the method's name, the error): the gateway counts them.
        self.refused = refused
        # What a refused call's handler is wrapped in (the per-RPC metrics count it too).
        self.measure = measure

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        arrival.set(time.perf_counter())
        handler = await continuation(details)
        method: str = details.method
        if handler is None or method.startswith(self.open_services):
            return handler
        try:
            identity = await identify(self.authenticator, credential_of(details.invocation_metadata))
        except AuthError as err:
            refusal = RequestError(grpc.StatusCode.UNAUTHENTICATED, str(err), reason="unauthenticated")
            if self.refused is not None:
                self.refused(method.rpartition("/")[2], refusal)
            refusing = _refuse(handler, refusal)
            return self.measure(method, refusing) if self.measure is not None else refusing
        # The RPC's handler runs in this task: it reads who is calling from here.
        current_identity.set(identity)
        return handler


def server_credentials(
    cert: Path | None, key: Path | None, client_ca: Path | None, *, setting: str = "ANTWORT_TLS"
) -> grpc.ServerCredentials | None:
    """TLS for a server's port from PEM files; None: plaintext. With `client_ca`, callers must
    present a certificate it signed (mTLS). `setting`: the variables' prefix, named in errors."""
    if cert is None and key is None:
        if client_ca is not None:
            raise StartupError(f"{setting}_CLIENT_CA needs {setting}_CERT and {setting}_KEY")
        return None
    if cert is None or key is None:
        raise StartupError(f"TLS needs both {setting}_CERT and {setting}_KEY")
    try:
        return grpc.ssl_server_credentials(
            [(key.read_bytes(), cert.read_bytes())],
            root_certificates=client_ca.read_bytes() if client_ca is not None else None,
            require_client_auth=client_ca is not None,
        )
    except OSError as err:
        raise StartupError(f"{setting}_*: {err}") from err


def is_loopback(listen: str) -> bool:
    """Whether only this machine can reach a listen address (a Unix socket counts)."""
    if listen.startswith("unix:"):
        return True
    host = listen.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
