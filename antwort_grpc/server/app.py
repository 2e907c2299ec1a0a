"""The gateway process: a grpc.aio server with the ResponsesService, health and reflection."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from antwort_grpc import pb
from antwort_grpc.auth.build import build_authenticator, refuse_open_listen
from antwort_grpc.auth.interceptor import AuthInterceptor, ConcurrencyLimit
from antwort_grpc.config import GatewaySettings
from antwort_grpc.engine import Engine, EngineConfig
from antwort_grpc.engine.budget import ServerLimits
from antwort_grpc.executors.base import ToolExecutor
from antwort_grpc.hooks import Dispatcher, build_hooks
from antwort_grpc.observability import Observability
from antwort_grpc.providers.base import Provider, ProviderHealth
from antwort_grpc.responses.request_limits import Limits
from antwort_grpc.server.decode import add_parsing_servicer
from antwort_grpc.server.servicer import ResponsesServicer
from antwort_grpc.server.tls import server_credentials
from antwort_grpc.startup_errors import StartupError
from antwort_grpc.storage.base import CancelSignals, ControlSignals, ResponseStore

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
    server: grpc.aio.Server
    port: int
    host: str
    engine: Engine
    store: ResponseStore
    health: HealthServicer
    watcher: asyncio.Task[None] | None = None
    # Ends the store's cancel delivery to this gateway's engine.
    unsubscribe: Callable[[], None] | None = None
    observability: Observability | None = None

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

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
        if self.unsubscribe is not None:
            self.unsubscribe()
        if self.observability is not None:
            self.observability.stop()
        if self.engine.config.hooks is not None:
            await self.engine.config.hooks.close()

    async def _cancel_runs_before(self, grace: float) -> None:
        runs = self.engine.runs
        # As the deadline path does: stop early enough for the terminal event to reach the client.
        if await runs.wait_idle(grace - min(SHUTDOWN_MARGIN, grace / 4)):
            return
        running = runs.running()
        log.info("cancelling %d responses still running at the end of the shutdown grace", len(running))
        for response_id in running:
            runs.stop(response_id, "cancelled")


def limits_of(settings: GatewaySettings) -> Limits:
    return Limits(
        max_tools=settings.max_tools,
        max_schema_bytes=settings.max_schema_bytes,
        max_schema_depth=settings.max_schema_depth,
        max_input_items=settings.max_input_items,
        max_metadata=settings.max_metadata,
    )


def server_limits(settings: GatewaySettings) -> ServerLimits:
    return ServerLimits(
        max_turns=settings.max_turns,
        max_tool_calls=settings.max_tool_calls,
        max_duration=settings.max_duration,
        max_output_tokens=settings.max_output_tokens,
        max_tool_timeout=settings.executor_call_timeout,
        context_max_items=settings.context_max_items,
        context_max_tokens=settings.context_max_tokens,
    )


async def start_hooks(settings: GatewaySettings) -> Dispatcher | None:
    """The configured hooks, started (a hook service that is down is retried in the background,
    its failure policy applying meanwhile); None when there are none."""
    if not settings.hooks:
        return None
    try:
        clients = build_hooks(settings.hooks, settings.hook_timeout, settings.hook_failure == "open")
    except ValueError as error:
        raise StartupError(f"--hook / ANTWORT_HOOKS: {error}") from error
    hooks = Dispatcher(clients)
    await hooks.start()
    return hooks


def _host_of(listen: str) -> str:
    host = listen.rsplit(":", 1)[0]
    return "127.0.0.1" if host in ("", "0.0.0.0", "[::]") else host


async def start_gateway(
    settings: GatewaySettings,
    *,
    provider: Provider,
    store: ResponseStore,
    executors: Sequence[ToolExecutor],
) -> Gateway:
    refuse_open_listen(settings)
    credentials = server_credentials(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
    interceptors = _interceptors(settings)
    observability = Observability.build(metrics_listen=settings.metrics_listen, log_format=settings.log_format)
    if observability is not None:
        # Observed from outside: the provider, store and executors wrapped, the streams intercepted.
        provider, store = observability.provider(provider), observability.store(store)
        executors = observability.wrap_executors(executors)
        interceptors.append(observability.interceptor())
    engine = Engine(
        provider,
        store,
        EngineConfig(
            executors=list(executors),
            default_model=settings.model,
            history_max_depth=settings.history_max_depth,
            history_max_bytes=settings.history_max_bytes,
            approval_timeout=settings.approval_timeout,
            limits=server_limits(settings),
            hooks=await start_hooks(settings),
        ),
    )
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 32 * 1024 * 1024),
            ("grpc.max_send_message_length", 32 * 1024 * 1024),
            ("grpc.so_reuseport", 0),
        ],
        interceptors=interceptors,
    )
    servicer = ResponsesServicer(engine, store, limits_of(settings))
    add_parsing_servicer(pb.add_ResponsesServiceServicer_to_server, servicer, server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    if settings.reflection:
        reflection.enable_server_reflection(
            [RESPONSES_SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
            server,
        )
    if credentials is None:
        port = server.add_insecure_port(settings.listen)
    else:
        port = server.add_secure_port(settings.listen, credentials)
    if port == 0:
        raise OSError(f"cannot listen on {settings.listen}")
    await server.start()
    await health.set("", SERVING)
    await health.set(RESPONSES_SERVICE, SERVING)
    for executor in executors:
        # Remote executors report their service's reachability under a name of their own.
        attach = getattr(executor, "attach_health", None)
        if attach is not None:
            await attach(health)
    log.info("antwort-grpc listening on %s", settings.listen.rsplit(":", 1)[0] + f":{port}")
    gateway = Gateway(server, port, _host_of(settings.listen), engine, store, health, observability=observability)
    if observability is not None:
        observability.start()
    if isinstance(store, CancelSignals):
        # Cancels requested on any replica (or through the store) stop runs of this engine.
        gateway.unsubscribe = store.on_cancel(engine.runs.stop)
    if isinstance(store, ControlSignals):
        # Controls sent on any replica reach the runs of this one.
        stop_cancels, stop_controls = gateway.unsubscribe, store.on_control(servicer.responses.deliver)

        def unsubscribe() -> None:
            stop_controls()
            if stop_cancels is not None:
                stop_cancels()

        gateway.unsubscribe = unsubscribe
    check = getattr(provider, "check_health", None)
    if check is not None:
        gateway.watcher = asyncio.create_task(_watch_backend(health, check))
    else:
        await health.set(BACKEND_HEALTH, SERVING)
    return gateway


def _interceptors(settings: GatewaySettings) -> list[grpc.aio.ServerInterceptor]:
    authenticator = build_authenticator(settings)
    limit = ConcurrencyLimit(settings.max_concurrent_responses) if settings.max_concurrent_responses > 0 else None
    if authenticator is None and limit is None:
        return []
    return [AuthInterceptor(authenticator, limit)]


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
