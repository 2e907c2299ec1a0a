"""How many worker processes `serve` runs, and the settings each is given."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from antwort_grpc import machine
from antwort_grpc.config import GatewaySettings
from antwort_grpc.gateway import Gateway, serving_line
from antwort_grpc.startup_errors import StartupError
from antwort_grpc.storage.factory import sqlite_path

log = logging.getLogger(__name__)

SETTING = "--workers / ANTWORT_WORKERS"
# A worker's own /metrics: loopback, any free port; the parent serves them all on metrics_listen.
WORKER_METRICS = "127.0.0.1:0"
# What the whole gateway may hold at once, divided evenly between its workers when set.
DIVIDED = ("max_running_responses", "memory_budget_bytes")
# The memory a worker is given room for, by default: one holds about 90 MB idle (measured) and
# some 72 KiB more per open stream (bench/RESULTS.md, rss_per_stream_kb): about 160 MB with a
# thousand streams, 512 MiB leaves room for its peaks. A pod with a memory limit and no CPU
# limit sees every core of its node: this keeps it from starting more workers than its memory holds.
WORKER_MEMORY = 512 * 1024 * 1024


def unshared_store(settings: GatewaySettings) -> str | None:
    """The store, named, when only one process can use it; None for PostgreSQL."""
    url = settings.store
    if url.startswith(("postgresql://", "postgres://")):
        return None
    if url in ("memory", "memory://"):
        return "the memory store"
    try:
        path = sqlite_path(url, settings.data_dir)
    except ValueError:
        return f"the store {url!r}"
    return f"the SQLite store {path}" if path is not None else f"the store {url!r}"


def planned(settings: GatewaySettings) -> tuple[int, str | None]:
    """The number of worker processes: the setting, else one per usable core (cgroup-aware) when
    the store can be shared, else 1; and when the default fell back to 1, the line that says why.
    StartupError for more than one on a store that cannot be shared."""
    unshared = unshared_store(settings)
    if settings.workers is None:
        if unshared is None:
            return default_count(), None
        return 1, f"one worker process: {unshared} serves one process ({SETTING} needs ANTWORT_STORE=postgresql://…)"
    if settings.workers > 1 and unshared is not None:
        raise StartupError(
            f"{SETTING}: {settings.workers} worker processes need a store they share "
            f"(ANTWORT_STORE=postgresql://…); {unshared} serves one process"
        )
    return settings.workers, None


def ready_saying(why: str | None, log_format: str) -> Callable[[Gateway], None] | None:
    """The one-process gateway's ready line, after the line saying why it is one process (logged
    once it serves: a gateway that fails to start says only why it failed)."""
    if why is None:
        return None

    def ready(gateway: Gateway) -> None:
        log.info("%s", why)
        print(serving_line(gateway.target, log_format), flush=True)

    return ready


def default_count() -> int:
    """One worker per core this process may use (its CPU affinity and cgroup quota), as many as
    the memory it may use has room for."""
    cores = int(machine.machine_cores())
    return max(1, min(cores, machine.memory_bytes() // WORKER_MEMORY))


def worker_settings(settings: GatewaySettings, count: int, listen: str, http_listen: str) -> dict[str, Any]:
    """The settings a worker is started with: the parent's, on the reserved ports, with its share
    of the gateway-wide limits that were set (those left unset are sized by its share of the
    machine, machine.share)."""
    values = settings.model_dump(mode="json", exclude_unset=True)
    values.update(listen=listen, http_listen=http_listen, workers=1)
    if settings.metrics_listen:
        values["metrics_listen"] = WORKER_METRICS
    for name in DIVIDED:
        value = getattr(settings, name)
        if value:
            values[name] = math.ceil(value / count)
    return values
