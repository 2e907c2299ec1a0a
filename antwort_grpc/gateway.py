"""The process root: builds the core once, opens the doors it is configured with (gRPC; the Open
Responses HTTP/SSE door) and owns the order of shutdown. No door builds, owns or closes the core.

Shutdown, whichever signal starts it:
1. every door reports NOT_SERVING (gRPC health, HTTP /health 503) while still taking work, so
   load balancers notice during the drain; background runs are handed to another replica;
2. after the drain, every door refuses new work at the same moment: the core's front refuses
   whatever reaches it (UNAVAILABLE; HTTP 503 with Retry-After), and the gRPC server refuses
   new calls;
3. the responses still running get the grace; shortly before it ends, those left are cancelled,
   so each client gets its terminal event and the response is stored;
4. the doors close, then the core, then the parts it was built on.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from antwort_grpc import tracing
from antwort_grpc.auth.build import refuse_open_listen
from antwort_grpc.config import GatewaySettings
from antwort_grpc.core import Core, Parts, assemble, build_core
from antwort_grpc.engine import Engine
from antwort_grpc.executors.base import ToolExecutor
from antwort_grpc.observability.logs import one_line
from antwort_grpc.observability.rpc_metrics import RpcMetrics
from antwort_grpc.providers.base import Provider
from antwort_grpc.server.app import GrpcDoor
from antwort_grpc.storage.base import ResponseStore

log = logging.getLogger(__name__)

# Responses still running this long before the shutdown grace ends are cancelled (a quarter of
# the grace when that is shorter).
SHUTDOWN_MARGIN = 1.0
# Ctrl-C: a person is waiting, so no drain and this grace instead of the configured one.
INTERRUPT_GRACE = 1.0
# Young-generation collections every this many allocations (CPython's default: 700).
GC_YOUNG_THRESHOLD = 10_000


class Door(Protocol):
    """What the process root asks of a door, in shutdown order."""

    async def drain(self) -> None:
        """Report not serving (health), still taking work."""
        ...

    def refuse(self, grace: float | None) -> None:
        """Refuse new work from now at the transport, if the door can (the core refuses the rest)."""
        ...

    async def close(self) -> None:
        """Stop serving: the runs have ended."""
        ...


@dataclass
class Gateway:
    """The core and the doors that serve it; the gRPC door first."""

    core: Core
    grpc: GrpcDoor
    doors: list[Door] = field(default_factory=list)
    # The parts the root assembled itself (closed last); None: the caller owns them.
    parts: Parts | None = None
    # Set when shutdown begins: health is NOT_SERVING from then on, at every door.
    draining: bool = False

    def accepting(self) -> bool:
        """Whether load balancers should still send it work (False from the start of shutdown)."""
        return not self.draining

    async def open(self, door: Door) -> None:
        """A door started elsewhere, now the root's to drain, refuse and close."""
        self.doors.append(door)

    @property
    def port(self) -> int:
        assert self.grpc.serving is not None
        return self.grpc.serving.port

    @property
    def target(self) -> str:
        return self.grpc.target

    @property
    def engine(self) -> Engine:
        return self.core.engine

    @property
    def store(self) -> ResponseStore:
        return self.core.store

    @property
    def metrics_port(self) -> int | None:
        server = self.core.observability.server if self.core.observability is not None else None
        return server.port if server is not None else None

    async def stop(self, grace: float | None = 5.0, drain: float = 0.0) -> None:
        """Shut down in the order the module's docstring gives."""
        self.draining = True
        for door in self.doors:
            await door.drain()
        # Background runs do not wait for the grace: another replica resumes them now.
        await self.core.hand_over()
        if drain > 0:
            await asyncio.sleep(drain)
        # From this moment every door refuses new work.
        self.core.front.closing = True
        for door in self.doors:
            door.refuse(grace)
        if grace:
            await self._cancel_runs_before(grace)
        runs = self.engine.runs
        for door in self.doors:
            await door.close()
        # Cancelled streams record their final status on their way out; let them.
        if not await runs.wait_idle(5.0):
            log.warning("responses still running after shutdown: %s", runs.running())
        # Only now: a cancel from another replica still reaches streams finishing in the grace.
        await self.core.close()
        if self.parts is not None:
            await self.parts.close()

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
    parts: Parts | None = None,
) -> Gateway:
    """The core built around these parts and served over gRPC on `settings.listen` (the other
    doors are opened with `Gateway.open`). `parts`: closed by the gateway when it stops."""
    refuse_open_listen(settings)
    core = await build_core(settings, parts or Parts(provider, store, list(executors)))
    metrics = core.observability.metrics if core.observability is not None else None
    door = GrpcDoor(settings, core, RpcMetrics(metrics) if metrics is not None else None)
    try:
        await door.start(settings.listen)
    except BaseException:
        await core.close()
        raise
    gateway = Gateway(core, door, [door], parts)
    core.start()
    return gateway


def tune_gc() -> None:
    """Garbage collection for a process that holds many streams: start-up objects are frozen
    (never walked again) and collections run far less often.

    Every streamed event allocates a few container objects; with the defaults, a gateway holding
    1,000 streams spent about 4 % of its time collecting, with pauses up to 100 ms that every
    stream's next token waited out (bench/RESULTS.md). Reference counting still frees nearly
    everything at once; only cyclic garbage waits longer."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


async def serve(settings: GatewaySettings, ready: Callable[[Gateway], None] | None = None) -> None:
    """`antwort-grpc serve`: assemble the parts, open the doors, serve until SIGTERM or SIGINT,
    shut down in order. `ready`: called once serving, instead of printing the ready line (a
    worker of `serve --workers N` tells its parent)."""
    from antwort_grpc.http.serving import open_door
    from antwort_grpc.open_files import raise_soft_limit

    # Before the doors size their connection bounds from it.
    raise_soft_limit()
    # Before anything starts: a refusal must not leave a local model or a store half opened.
    refuse_open_listen(settings)
    parts = await assemble(settings)
    try:
        gateway = await start_gateway(
            settings, provider=parts.provider, store=parts.store, executors=parts.executors, parts=parts
        )
    except BaseException:
        await parts.close()
        raise
    try:
        try:
            door = await open_door(settings, gateway.core.front, gateway.accepting)
        except BaseException:
            await gateway.stop(0)
            raise
        if door is not None:
            await gateway.open(door)
        tune_gc()
        if ready is not None:
            ready(gateway)
        else:
            # The line scripts wait for; in the log format, so stdout too is JSON with --log-format json.
            print(serving_line(gateway.target, settings.log_format), flush=True)
        await serve_until_signalled(gateway, settings.shutdown_grace, settings.shutdown_drain, settings.interrupt_grace)
    finally:
        # Export the spans still buffered.
        tracing.shutdown()


def serving_line(target: str, log_format: str) -> str:
    return one_line(f"antwort-grpc serving on {target}", log_format, target=target)


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
