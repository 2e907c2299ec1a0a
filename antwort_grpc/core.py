"""The composition root: the gateway's core built from its settings, whatever door serves it.

`assemble` opens the parts that hold resources (store, model backend, remote executors);
`build_core` puts the rest around them — observation, hooks, the engine, the responses layer, the
neutral edge (identity, admission, observation), the front every door calls and the cross-replica
wiring — so a door (server/ for gRPC, http/ for HTTP/SSE) only adapts requests, errors and
streams. The process root (gateway.py) calls both and opens the doors.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from antwort_grpc import machine
from antwort_grpc.auth.build import build_authenticator
from antwort_grpc.auth.identity import Authenticator
from antwort_grpc.config import GatewaySettings
from antwort_grpc.durable.creates import Durability, DurableParts
from antwort_grpc.durable.settings import DurableSettings
from antwort_grpc.edge import Admission, ConcurrencyLimit, Edge
from antwort_grpc.engine import Engine, EngineConfig
from antwort_grpc.engine.budget import ControlLimits, ServerLimits
from antwort_grpc.executors.base import FunctionExecutor, ToolExecutor
from antwort_grpc.front import Front
from antwort_grpc.hooks import Dispatcher, build_hooks
from antwort_grpc.observability import Observability
from antwort_grpc.providers.base import Provider, capabilities_of
from antwort_grpc.responses.request_limits import Limits
from antwort_grpc.responses.service import Responses
from antwort_grpc.startup_errors import StartupError
from antwort_grpc.storage.base import CancelSignals, ControlSignals, ResponseStore
from antwort_grpc.storage.runlog import RunLog

log = logging.getLogger(__name__)

Closer = Callable[[], Awaitable[None]]


@dataclass
class Parts:
    provider: Provider
    store: ResponseStore
    executors: list[ToolExecutor]
    # Called in reverse order on shutdown.
    closers: list[Closer] = field(default_factory=list)

    async def close(self) -> None:
        await close_all(self.closers)


async def close_all(closers: list[Closer]) -> None:
    for close in reversed(closers):
        try:
            await close()
        except Exception:
            log.exception("shutdown step failed")


async def assemble(settings: GatewaySettings) -> Parts:
    from antwort_grpc.providers.factory import build_provider
    from antwort_grpc.storage.factory import open_store, options_from

    closers: list[Closer] = []
    try:
        store = await open_store(settings.store, settings.data_dir, options_from(settings))
    except Exception as error:  # whatever the store's driver raises, the setting to change is the same
        where = settings.store or f"SQLite under --data-dir {settings.data_dir}"
        raise StartupError(f"--store / ANTWORT_STORE ({where}): {error}") from error
    if hasattr(store, "close"):
        closers.append(store.close)
    try:
        provider = await build_provider(settings)
    except BaseException:
        await close_all(closers)  # a store left open would keep its threads and lock
        raise
    if hasattr(provider, "aclose"):
        closers.append(provider.aclose)
    executors: list[ToolExecutor] = [FunctionExecutor()]
    if settings.executors:
        from antwort_grpc.executors.credentials import channel_credentials, read_token
        from antwort_grpc.executors.remote import RemoteSettings, build_executors, start_all

        remote = build_executors(
            settings.executors,
            RemoteSettings(
                refresh_interval=settings.executor_refresh_seconds,
                call_timeout=settings.executor_call_timeout,
                credentials=channel_credentials(
                    settings.executor_ca, settings.executor_client_cert, settings.executor_client_key
                ),
                token=read_token(settings.executor_token, settings.executor_token_file, "ANTWORT_EXECUTOR_TOKEN"),
            ),
        )
        # A service that is down does not stop the gateway: it is retried in the background, and
        # its calls fail as tool errors the model sees meanwhile.
        closers += [r.close for r in remote]
        await start_all(remote)
        executors += remote
    return Parts(provider, store, executors, closers)


@dataclass
class Core:
    """Everything but the doors, built once."""

    provider: Provider
    store: ResponseStore
    executors: list[ToolExecutor]
    engine: Engine
    responses: Responses
    edge: Edge
    authenticator: Authenticator | None
    observability: Observability | None
    # Ends the store's delivery of cancels and controls from other replicas to this engine.
    unsubscribe: list[Callable[[], None]] = field(default_factory=list)
    # Background responses and idempotency keys; None with a store that keeps no run log.
    durable: Durability | None = None
    # The one entry per request every door calls (front/).
    front: Front = field(init=False)

    def start(self) -> None:
        """Controls and cancels sent on any replica (or through the store) reach the runs here;
        the metrics endpoint serves."""
        store, runs = self.store, self.engine.runs
        if isinstance(store, CancelSignals):
            self.unsubscribe.append(store.on_cancel(runs.stop))
        if isinstance(store, ControlSignals):
            self.unsubscribe.append(store.on_control(self.responses.deliver))
        if self.observability is not None:
            self.observability.start()
        if self.durable is not None:
            self.durable.background.start()
        self.edge.admission.lag.start()

    async def hand_over(self) -> None:
        """Shutdown: background runs go to another replica now (or to this one's restart)."""
        if self.durable is not None:
            await self.durable.background.hand_over()

    async def close(self) -> None:
        """After the doors stopped: no more controls from other replicas, observation off, hooks
        closed (the parts themselves close with `Parts.close`)."""
        await self.hand_over()
        for unsubscribe in self.unsubscribe:
            unsubscribe()
        self.unsubscribe = []
        self.front.stalls.close()
        self.edge.admission.lag.stop()
        if self.observability is not None:
            self.observability.stop()
        if self.engine.config.hooks is not None:
            await self.engine.config.hooks.close()


async def build_core(settings: GatewaySettings, parts: Parts) -> Core:
    """The core around assembled parts; StartupError (one line naming the setting) when a setting
    is wrong."""
    authenticator = build_authenticator(settings)
    provider, store, executors = parts.provider, parts.store, list(parts.executors)
    observability = Observability.build(metrics_listen=settings.metrics_listen, log_format=settings.log_format)
    if observability is not None:
        # Observed from outside: the provider, store and executors wrapped, the streams watched.
        provider, store = observability.provider(provider), observability.store(store)
        executors = observability.wrap_executors(executors)
    engine = Engine(
        provider,
        store,
        EngineConfig(
            executors=executors,
            default_model=settings.model,
            history_max_depth=settings.history_max_depth,
            history_max_bytes=settings.history_max_bytes,
            approval_timeout=settings.approval_timeout,
            limits=server_limits(settings),
            hooks=await start_hooks(settings),
            controls=control_limits(settings),
        ),
    )
    admits = admission(settings)
    per_principal, background = principal_limits(settings, admits.max_running, authenticator is not None)
    edge = Edge(
        authenticator,
        ConcurrencyLimit(per_principal) if per_principal else None,
        observability.observer() if observability is not None else None,
        admits,
        ConcurrencyLimit(background) if background else None,
    )
    responses = Responses(engine, store, request_limits(settings), capabilities_of(parts.provider))
    runlog = getattr(parts.store, "runlog", None)
    # Background responses and idempotency keys, over the responses layer's creates; not offered
    # with a store that keeps no run log. A run taken over from another replica counts against
    # this one's admission (the edge).
    durable = (
        Durability(responses, DurableParts(runlog, durable_settings(settings), edge))
        if isinstance(runlog, RunLog)
        else None
    )
    core = Core(provider, store, executors, engine, responses, edge, authenticator, observability, durable=durable)
    core.front = Front(
        responses,
        edge,
        core.durable,
        settings.converse_idle_timeout,
        settings.stream_write_timeout,
        settings.background_max_duration,
    )
    return core


def durable_settings(settings: GatewaySettings) -> DurableSettings:
    return settings.part(
        DurableSettings,
        "background_",
        keep=("claim_batch",),
        idempotency_ttl_seconds=settings.idempotency_ttl_seconds,
    )


# One process serves every stream on one event loop, whatever the cores: about 500 streams at 10
# tokens a second keep its token lag p99 near 100 ms on the 2-core host (1,000 took it to 2.75 s,
# and grpc then took calls in too slowly to keep them). More cores serve more with more workers.
RUNNING_PER_PROCESS = 512
# The rest of the memory: the process itself, the memory store, parsing, what the estimate misses.
MEMORY_BUDGET_SHARE = 4


def admission(settings: GatewaySettings) -> Admission:
    """The gateway's limits of responses at once, sized for the machine unless set."""
    running = settings.max_running_responses
    budget = settings.memory_budget_bytes
    return Admission(
        max_running=RUNNING_PER_PROCESS if running is None else running,
        memory_budget=machine.memory_bytes() // MEMORY_BUDGET_SHARE if budget is None else budget,
        max_lag=settings.admission_max_lag,
    )


def principal_limits(settings: GatewaySettings, running_cap: int, authenticates: bool) -> tuple[int, int]:
    """How many responses, and background responses, one principal may run at once (0: no limit).
    Without authentication every caller is the same principal: no share applies."""
    shared = authenticates and running_cap > 0
    per_principal = settings.max_concurrent_responses
    if per_principal is None:
        per_principal = max(1, math.ceil(running_cap * settings.principal_share)) if shared else 0
    background = max(1, math.ceil(running_cap * settings.background_share)) if shared else 0
    return per_principal, background


def request_limits(settings: GatewaySettings) -> Limits:
    return settings.part(Limits)


def control_limits(settings: GatewaySettings) -> ControlLimits:
    # What a response holds in all, with what controls add, is bounded by the history cap.
    return settings.part(
        ControlLimits, max_items=settings.max_control_items, max_response_bytes=settings.history_max_bytes
    )


def server_limits(settings: GatewaySettings) -> ServerLimits:
    return settings.part(ServerLimits, max_tool_timeout=settings.executor_call_timeout)


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
