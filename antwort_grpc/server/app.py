"""The gateway process: a grpc.aio server with the ResponsesService, health and reflection."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from antwort_grpc import pb
from antwort_grpc.auth.build import refuse_open_listen
from antwort_grpc.config import GatewaySettings
from antwort_grpc.core import Core, Parts, build_core
from antwort_grpc.engine import Engine
from antwort_grpc.executors.base import ToolExecutor
from antwort_grpc.grpc_security import AuthInterceptor, server_credentials
from antwort_grpc.grpc_server import ServerSpec, Serving, bound_address, start_server
from antwort_grpc.observability import Observability
from antwort_grpc.observability.rpc_metrics import RpcMetrics
from antwort_grpc.providers.base import Provider, ProviderHealth
from antwort_grpc.server.connections import connection_options
from antwort_grpc.server.decode import EVERY_MESSAGE, Admitting, add_parsing_servicer
from antwort_grpc.server.servicer import ResponsesServicer
from antwort_grpc.storage.base import ResponseStore

log = logging.getLogger(__name__)

RESPONSES_SERVICE = "antwort.v1.ResponsesService"
# Health of the model backend, separate from the gateway's own: the gateway keeps serving reads
# (and answers new responses with backend_unavailable) while the backend is down.
BACKEND_HEALTH = "antwort.v1.ModelBackend"
BACKEND_CHECK_INTERVAL = 10.0
# Responses still running this long before the shutdown grace ends are cancelled (a quarter of
# the grace when that is shorter).
SHUTDOWN_MARGIN = 1.0
# Ctrl-C: a person is waiting, so no drain and this grace instead of the configured one.
INTERRUPT_GRACE = 1.0
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVING = health_pb2.HealthCheckResponse.SERVING


@dataclass
class Gateway:
    """The core served at its gRPC door."""

    serving: Serving
    core: Core
    watcher: asyncio.Task[None] | None = None
    # Set when shutdown begins: health is NOT_SERVING from then on, at every door.
    draining: bool = False

    def accepting(self) -> bool:
        """Whether load balancers should still send it work (False from the start of shutdown)."""
        return not self.draining

    @property
    def server(self) -> grpc.aio.Server:
        return self.serving.server

    @property
    def port(self) -> int:
        return self.serving.port

    @property
    def host(self) -> str:
        return self.serving.host

    @property
    def health(self) -> HealthServicer:
        return self.serving.health

    @property
    def engine(self) -> Engine:
        return self.core.engine

    @property
    def store(self) -> ResponseStore:
        return self.core.store

    @property
    def observability(self) -> Observability | None:
        return self.core.observability

    @property
    def target(self) -> str:
        return self.serving.target

    @property
    def metrics_port(self) -> int | None:
        server = self.observability.server if self.observability is not None else None
        return server.port if server is not None else None

    async def stop(self, grace: float | None = 5.0, drain: float = 0.0) -> None:
        """Health goes NOT_SERVING; for `drain` seconds calls are still accepted so probes and load
        balancers notice; then new calls are refused and in-flight responses get `grace` seconds to
        finish. Shortly before the grace runs out the ones still running are cancelled, so each
        client gets its terminal `cancelled` event (and the response is stored) before the server
        cuts what is left."""
        if self.watcher is not None:
            self.watcher.cancel()
        # Background runs do not wait for the grace: another replica resumes them now.
        self.draining = True
        await self.core.hand_over()
        await self.health.enter_graceful_shutdown()
        if drain > 0:
            await asyncio.sleep(drain)
        stopping = asyncio.ensure_future(self.server.stop(grace))
        if grace:
            await self._cancel_runs_before(grace)
        await stopping
        # Cancelled streams record their final status on their way out; let them.
        if not await self.engine.runs.wait_idle(5.0):
            log.warning("responses still running after shutdown: %s", self.engine.runs.running())
        # Only now: a cancel from another replica still reaches streams finishing in the grace.
        await self.core.close()

    async def _cancel_runs_before(self, grace: float) -> None:
        runs = self.engine.runs
        # As the deadline path does: stop early enough for the terminal event to reach the client.
        if await runs.wait_idle(grace - min(SHUTDOWN_MARGIN, grace / 4)):
            return
        running = runs.running()
        log.info("cancelling %d responses still running at the end of the shutdown grace", len(running))
        for response_id in running:
            runs.stop(response_id, "cancelled")


async def start_gateway(
    settings: GatewaySettings,
    *,
    provider: Provider,
    store: ResponseStore,
    executors: Sequence[ToolExecutor],
) -> Gateway:
    """The core built around these parts and served over gRPC on `settings.listen`."""
    refuse_open_listen(settings)
    credentials = server_credentials(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
    core = await build_core(settings, Parts(provider, store, list(executors)))
    servicer = ResponsesServicer(core.responses, core.edge, settings.converse_idle_timeout)
    edge = core.edge
    # The requests that start a response are admitted by their size before they are parsed.
    admitting = Admitting(
        edge.admission.reserve,
        {"CreateResponse": EVERY_MESSAGE, "Converse": pb.ConverseRequest.CREATE_FIELD_NUMBER},
        max_request_bytes=core.responses.limits.max_request_bytes,
    )
    interceptors: list[grpc.aio.ServerInterceptor] = []
    metrics = core.observability.metrics if core.observability is not None else None
    # Every RPC counted and timed, the ones authentication refuses too: each handler wrapped once.
    rpc = RpcMetrics(metrics) if metrics is not None else None
    if core.authenticator is not None:
        measure = rpc.measure if rpc is not None else None
        interceptors.append(AuthInterceptor(core.authenticator, refused=edge.refused, measure=measure))
    spec = ServerSpec(
        services=[RESPONSES_SERVICE],
        add_services=lambda server: add_parsing_servicer(
            pb.add_ResponsesServiceServicer_to_server, servicer, server, refused=edge.refused, admitting=admitting
        ),
        credentials=credentials,
        interceptors=interceptors,
        options=connection_options(settings),
        reflection=settings.reflection,
        adding=rpc.server if rpc is not None else None,
    )
    try:
        serving = await start_server(settings.listen, spec)
    except BaseException:
        await core.close()
        raise
    for executor in core.executors:
        # Remote executors report their service's reachability under a name of their own.
        attach = getattr(executor, "attach_health", None)
        if attach is not None:
            await attach(serving.health)
    log.info("antwort-grpc listening on %s", bound_address(settings.listen, serving.port))
    gateway = Gateway(serving, core)
    core.start()
    check = getattr(provider, "check_health", None)
    if check is not None:
        gateway.watcher = asyncio.create_task(_watch_backend(serving.health, check))
    else:
        await serving.health.set(BACKEND_HEALTH, SERVING)
    return gateway


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


async def serve_until_signalled(
    gateway: Gateway, grace: float, drain: float, interrupt_grace: float = INTERRUPT_GRACE
) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully.

    SIGTERM (Kubernetes): NOT_SERVING for `drain` seconds, then `grace` seconds for in-flight
    responses. SIGINT (Ctrl-C, someone at a terminal): no drain and at most `interrupt_grace`
    seconds; a second Ctrl-C ends the process at once."""
    loop = asyncio.get_running_loop()
    received: asyncio.Future[signal.Signals] = loop.create_future()

    def on_signal(sig: signal.Signals) -> None:
        if received.done():
            return
        received.set_result(sig)
        # The default action from now on: the next Ctrl-C ends the process even if the loop is busy.
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    how = "%d responses in flight, %.1fs grace"
    if await received == signal.SIGINT:
        grace, drain = min(grace, interrupt_grace), 0.0
        how += " (Ctrl-C again to exit at once)"
    log.info("shutting down: " + how, len(gateway.engine.runs.running()), grace)
    await gateway.stop(grace, drain)
