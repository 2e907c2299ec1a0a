"""The gRPC door: a grpc.aio server with the ResponsesService (the core's front, adapted by the
servicer), health, reflection, TLS and the bearer-credential interceptor. The process root
(gateway.py) builds the core, opens this door and tells it when to drain, refuse and close."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from antwort_grpc import pb
from antwort_grpc.config import GatewaySettings
from antwort_grpc.core import Core
from antwort_grpc.grpc_security import AuthInterceptor, server_credentials
from antwort_grpc.grpc_server import ServerSpec, Serving, bound_address, start_server
from antwort_grpc.providers.base import ProviderHealth
from antwort_grpc.server.connections import connection_options
from antwort_grpc.server.conversations import ConversationsServicer
from antwort_grpc.server.decode import EVERY_MESSAGE, add_parsing_servicer
from antwort_grpc.server.servicer import ResponsesServicer

log = logging.getLogger(__name__)

RESPONSES_SERVICE = "antwort.v1.ResponsesService"
CONVERSATIONS_SERVICE = "antwort.v1.ConversationsService"
# Health of the model backend, separate from the gateway's own: the gateway keeps serving reads
# (and answers new responses with backend_unavailable) while the backend is down.
BACKEND_HEALTH = "antwort.v1.ModelBackend"
BACKEND_CHECK_INTERVAL = 10.0
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVING = health_pb2.HealthCheckResponse.SERVING
# The requests that start a response, handed to the core undecoded: it admits them by their size
# first (a Converse message only when it is a create).
UNDECODED = {
    "CreateResponse": EVERY_MESSAGE,
    "CompactConversation": EVERY_MESSAGE,
    "Converse": pb.ConverseRequest.CREATE_FIELD_NUMBER,
}


class RpcMeasure(Protocol):
    """Every RPC counted and timed, the ones authentication refuses too (observability's
    RpcMetrics): each handler wrapped once, as it is added."""

    def server(self, server: grpc.aio.Server) -> grpc.aio.Server: ...

    def measure(self, method: str, handler: Any) -> Any: ...


# The methods grpc matches calls to directly; the rest go through the generic handler (decode.py
# `add_parsing_servicer`: each registered method costs every call a little in grpc.aio's intake).
BUSY_METHODS = frozenset({"CreateResponse", "Converse", "AttachResponse", "GetResponse"})


class GrpcDoor:
    """The core served over gRPC on `settings.listen`."""

    def __init__(self, settings: GatewaySettings, core: Core, measured: RpcMeasure | None = None) -> None:
        """`measured`: the per-RPC metrics the process root wraps every handler in (None: off)."""
        self.settings = settings
        self.core = core
        self.measured = measured
        self.serving: Serving | None = None
        self.watcher: asyncio.Task[None] | None = None
        self._stopping: asyncio.Future[None] | None = None

    @property
    def server(self) -> grpc.aio.Server:
        assert self.serving is not None
        return self.serving.server

    @property
    def health(self) -> HealthServicer:
        assert self.serving is not None
        return self.serving.health

    @property
    def target(self) -> str:
        assert self.serving is not None
        return self.serving.target

    async def start(self, listen: str) -> None:
        settings, core = self.settings, self.core
        front = core.front
        credentials = server_credentials(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
        interceptors: list[grpc.aio.ServerInterceptor] = []
        rpc = self.measured
        if core.authenticator is not None:
            measure = rpc.measure if rpc is not None else None
            interceptors.append(AuthInterceptor(core.authenticator, refused=front.refuse, measure=measure))
        servicer = ResponsesServicer(front)
        conversations = ConversationsServicer(front)

        def add_services(server: grpc.aio.Server) -> None:
            add_parsing_servicer(
                pb.add_ResponsesServiceServicer_to_server,
                servicer,
                server,
                refused=front.refuse,
                undecoded=UNDECODED,
                registered=BUSY_METHODS,
            )
            add_parsing_servicer(
                pb.add_ConversationsServiceServicer_to_server, conversations, server, front.refuse, registered=()
            )

        spec = ServerSpec(
            services=[RESPONSES_SERVICE, CONVERSATIONS_SERVICE],
            add_services=add_services,
            credentials=credentials,
            interceptors=interceptors,
            options=connection_options(settings),
            reflection=settings.reflection,
            adding=rpc.server if rpc is not None else None,
            reuse_port=settings.worker is not None,
        )
        serving = self.serving = await start_server(listen, spec)
        for executor in core.executors:
            # Remote executors report their service's reachability under a name of their own.
            attach = getattr(executor, "attach_health", None)
            if attach is not None:
                await attach(serving.health)
        log.info("antwort-grpc listening on %s", bound_address(listen, serving.port))
        check = getattr(core.provider, "check_health", None)
        if check is not None:
            self.watcher = asyncio.create_task(_watch_backend(serving.health, check))
        else:
            await serving.health.set(BACKEND_HEALTH, SERVING)

    async def drain(self) -> None:
        """Health NOT_SERVING: load balancers stop sending work; calls are still taken."""
        if self.watcher is not None:
            self.watcher.cancel()
        if self.serving is not None:
            await self.serving.health.enter_graceful_shutdown()

    def refuse(self, grace: float | None) -> None:
        """New calls refused (UNAVAILABLE) from now; those running get `grace` seconds."""
        if self.serving is not None and self._stopping is None:
            self._stopping = asyncio.ensure_future(self.serving.server.stop(grace))

    async def close(self) -> None:
        """Once the runs have ended: the server stopped for good."""
        self.refuse(0)
        if self._stopping is not None:
            await self._stopping


async def _watch_backend(health: HealthServicer, check: Callable[[], Awaitable[ProviderHealth]]) -> None:
    """Report the backend's reachability under its own health service name, and log changes."""
    last: bool | None = None
    while True:
        try:
            result = await check()
            ok, detail = result.ok, result.detail
        except Exception as err:
            ok, detail = False, f"{type(err).__name__}: {err}"
        if ok != last:
            if ok:
                log.info("model backend is reachable")
            else:
                log.warning("model backend is unavailable: %s", detail)
            await health.set(BACKEND_HEALTH, SERVING if ok else NOT_SERVING)
            last = ok
        await asyncio.sleep(BACKEND_CHECK_INTERVAL)
