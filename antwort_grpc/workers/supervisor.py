"""The parent of `serve --workers N`: reserve the ports, start the embedded model once, start the
workers and keep them running, forward SIGTERM and SIGINT to them and wait for them all."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from antwort_grpc.auth.build import refuse_open_listen
from antwort_grpc.config import GatewaySettings
from antwort_grpc.gateway import serving_line
from antwort_grpc.grpc_server import host_of
from antwort_grpc.observability.logs import real_stderr
from antwort_grpc.startup_errors import StartupError
from antwort_grpc.workers.metrics import MetricsProxy, WorkerMetrics
from antwort_grpc.workers.plan import worker_settings
from antwort_grpc.workers.ports import Reserved, reserve

log = logging.getLogger(__name__)

CHILD = "antwort_grpc.workers.child"
LISTEN = "--listen / ANTWORT_LISTEN"
HTTP_LISTEN = "--http-listen / ANTWORT_HTTP_LISTEN"
METRICS_LISTEN = "--metrics-listen / ANTWORT_METRICS_LISTEN"
# Seconds a worker may take to serve (store opened and migrated, doors open).
STARTUP_TIMEOUT = 120.0
# Beyond its drain and grace, the seconds a stopping worker may take to close; then it is killed.
EXIT_MARGIN = 15.0
# A worker that served this long before it died is started again at once; one that dies sooner
# waits 1 s, then twice as long each time, up to the last.
STABLE_SECONDS = 30.0
MAX_RESTART_DELAY = 30.0

Spec = Callable[[int], dict[str, Any]]


class WorkerFailed(Exception):
    """A worker exited before it served."""


@dataclass
class Worker(WorkerMetrics):
    process: asyncio.subprocess.Process | None = None
    started: float = 0.0


class Supervisor:
    """The worker processes: started, watched, started again when one dies, signalled together."""

    def __init__(self, count: int, spec: Spec, stderr: int) -> None:
        self.workers = [Worker(index, None, 0) for index in range(count)]
        self.spec = spec
        self.stderr = stderr
        self.stopping = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> bool:
        """Every worker serving: True; False when a signal came first. StartupError (the others
        stopped) when one exits before it serves; its own line on stderr says why."""
        results = await asyncio.gather(*(self._launch(w) for w in self.workers), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed and not self.stopping:
            self.stopping = True
            self.forward(signal.SIGTERM)
            await self.wait(EXIT_MARGIN)
            if isinstance(failed[0], WorkerFailed | OSError):
                raise StartupError(str(failed[0])) from failed[0]
            raise failed[0]
        return not self.stopping

    async def _launch(self, worker: Worker) -> None:
        """The worker started, once it serves; WorkerFailed when it exits before."""
        process = worker.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", CHILD,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=self.stderr,
            # A group of its own: a terminal's Ctrl-C reaches the parent alone, which forwards it once.
            process_group=0,
        )  # fmt: skip
        worker.port, worker.started = None, asyncio.get_running_loop().time()
        if self.stopping:
            process.send_signal(signal.SIGTERM)
        assert process.stdin is not None and process.stdout is not None
        line = b""
        with contextlib.suppress(ConnectionError):
            process.stdin.write(json.dumps(self.spec(worker.index)).encode() + b"\n")
            await process.stdin.drain()
        try:
            async with asyncio.timeout(STARTUP_TIMEOUT):
                line = await process.stdout.readline()
        except TimeoutError:
            process.kill()
            await process.wait()
            raise WorkerFailed(f"worker {worker.index} did not serve within {STARTUP_TIMEOUT:.0f} s: killed") from None
        if not line:
            code = await process.wait()
            raise WorkerFailed(f"worker {worker.index} exited before it served (exit code {code})")
        worker.port = json.loads(line).get("metrics_port")
        log.info("worker %d serving (pid %d)", worker.index, process.pid)
        task = asyncio.create_task(self._watch(worker, process))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch(self, worker: Worker, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        async for line in process.stdout:  # whatever else it prints goes on to the parent's stdout
            sys.stdout.buffer.write(line)
            sys.stdout.flush()
        code = await process.wait()
        if self.stopping:
            return
        served = asyncio.get_running_loop().time() - worker.started
        log.warning("worker %d (pid %d) exited with code %d; starting it again", worker.index, process.pid, code)
        delay = 0.0 if served >= STABLE_SECONDS else 1.0
        while not self.stopping:
            await asyncio.sleep(delay)
            if self.stopping:
                return
            worker.restarts += 1
            try:
                await self._launch(worker)
                return
            except (WorkerFailed, OSError) as error:
                log.error("%s", error)
                delay = min(MAX_RESTART_DELAY, max(1.0, 2 * delay))

    def forward(self, sig: signal.Signals) -> None:
        for worker in self.workers:
            process = worker.process
            if process is not None and process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(sig)

    def on_signals(self) -> asyncio.Future[signal.Signals]:
        """SIGTERM and SIGINT forwarded to every worker, each time (a second Ctrl-C ends them at
        once); the first of them, for the caller to wait on."""
        loop = asyncio.get_running_loop()
        first: asyncio.Future[signal.Signals] = loop.create_future()

        def on_signal(sig: signal.Signals) -> None:
            self.stopping = True
            self.forward(sig)
            if not first.done():
                first.set_result(sig)

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        return first

    async def wait(self, timeout: float) -> None:
        """Every worker exited: those still running after `timeout` seconds are killed."""
        processes = [w.process for w in self.workers if w.process is not None]
        waiting = [asyncio.ensure_future(p.wait()) for p in processes]
        if not waiting:
            return
        _, late = await asyncio.wait(waiting, timeout=timeout)
        for process in processes:
            if process.returncode is None:
                log.error("worker pid %d did not stop within %.0f s: killed", process.pid, timeout)
                process.kill()
        await asyncio.gather(*late)
        for task in list(self._tasks):
            task.cancel()


def _reserve_http(settings: GatewaySettings) -> Reserved | None:
    """The HTTP door's port; None when the door is off (a default address already taken turns it
    off, as with one process)."""
    listen = settings.http_listen.strip()
    if listen.lower() in ("", "off"):
        return None
    try:
        return reserve(listen, HTTP_LISTEN)
    except StartupError as error:
        if "http_listen" in settings.model_fields_set:
            raise
        log.warning("the HTTP door is off: %s", error)
        return None


async def _start_model(settings: GatewaySettings, stack: AsyncExitStack) -> str | None:
    """The embedded local model, started once for every worker; None when another backend serves."""
    if settings.backend_url or settings.script is not None:
        return None
    from antwort_grpc.providers.factory import build_provider
    from antwort_grpc.providers.local_model import LocalModelProvider

    provider = await build_provider(settings)
    assert isinstance(provider, LocalModelProvider)
    stack.push_async_callback(provider.aclose)
    return provider.base_url


async def _serve_metrics(listen: str, supervisor: Supervisor, stack: AsyncExitStack) -> None:
    proxy = MetricsProxy(lambda: supervisor.workers)
    stack.push_async_callback(proxy.stop)
    try:
        await proxy.start(listen)
    except OSError as error:
        raise StartupError(
            f"cannot listen on {listen} ({error.strerror or error}): choose another address with {METRICS_LISTEN}"
        ) from error
    log.info("every worker's metrics on %s (port %d)", listen, proxy.port)


def _stop_timeout(settings: GatewaySettings, sig: signal.Signals) -> float:
    if sig == signal.SIGINT:
        return min(settings.shutdown_grace, settings.interrupt_grace) + EXIT_MARGIN
    return settings.shutdown_drain + settings.shutdown_grace + EXIT_MARGIN


async def supervise(settings: GatewaySettings, count: int) -> None:
    """`antwort-grpc serve` with `count` worker processes, until SIGTERM or SIGINT."""
    refuse_open_listen(settings)
    async with AsyncExitStack() as stack:
        grpc_port = reserve(settings.listen, LISTEN)
        stack.callback(grpc_port.close)
        http_port = _reserve_http(settings)
        if http_port is not None:
            stack.callback(http_port.close)
        model_url = await _start_model(settings, stack)
        child_settings = worker_settings(
            settings, count, grpc_port.listen, http_port.listen if http_port is not None else "off"
        )

        def spec(index: int) -> dict[str, Any]:
            return {"index": index, "count": count, "model_url": model_url, "settings": child_settings}

        supervisor = Supervisor(count, spec, real_stderr())
        if settings.metrics_listen:
            await _serve_metrics(settings.metrics_listen, supervisor, stack)
        stopped = supervisor.on_signals()
        if await supervisor.start():
            target = f"{host_of(settings.listen)}:{grpc_port.port}"
            log.info("%d worker processes serving on %s", count, target)
            print(serving_line(target, settings.log_format), flush=True)
        sig = await stopped
        log.info("shutting down %d worker processes (%s)", count, sig.name)
        await supervisor.wait(_stop_timeout(settings, sig))
