"""The parent's /metrics: every worker's metrics, each series labelled `worker` with its index.

Each worker serves its own registry on a loopback port (the gateway's metrics are collectors of
its own, which prometheus-client's multiprocess mode cannot merge); a scrape of the parent reads
them all at that moment. Sum over workers in the query: `sum without (worker) (...)`. With them,
`antwort_worker_up` (1: its metrics were read) and `antwort_worker_restarts_total`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

# A worker that does not answer a scrape within this is left out of it (its `up` is 0).
SCRAPE_TIMEOUT = 5.0


@dataclass
class WorkerMetrics:
    index: int
    # Its /metrics port; None while it starts.
    port: int | None
    restarts: int


def merged(texts: Sequence[tuple[WorkerMetrics, str | None]]) -> list[Metric]:
    """The families of every worker's exposition, the worker's index added to each sample's labels."""
    families: dict[str, Metric] = {}
    up = GaugeMetricFamily("antwort_worker_up", "1 when the worker's metrics were read", labels=["worker"])
    restarts = CounterMetricFamily(
        "antwort_worker_restarts", "Times the worker was started again after it died", labels=["worker"]
    )
    for worker, text in texts:
        index = str(worker.index)
        up.add_metric([index], 0 if text is None else 1)
        restarts.add_metric([index], worker.restarts)
        for family in text_string_to_metric_families(text or ""):
            into = families.get(family.name)
            if into is None:
                into = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            into.samples += [
                Sample(s.name, {**s.labels, "worker": index}, s.value, s.timestamp, s.exemplar) for s in family.samples
            ]
    return [*families.values(), up, restarts]


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def exposition(families: list[Metric]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry)


class MetricsProxy:
    """The parent's /metrics endpoint on `listen`."""

    def __init__(self, workers: Callable[[], Sequence[WorkerMetrics]]) -> None:
        self.workers = workers
        self.runner: web.AppRunner | None = None
        self.session: aiohttp.ClientSession | None = None
        self.port = 0

    async def start(self, listen: str) -> None:
        host, _, port = listen.rpartition(":")
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host.strip("[]") or "0.0.0.0", int(port))
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else int(port)
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT))

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        if self.session is not None:
            await self.session.close()

    async def _read(self, worker: WorkerMetrics) -> str | None:
        if worker.port is None or self.session is None:
            return None
        try:
            async with self.session.get(f"http://127.0.0.1:{worker.port}/metrics") as reply:
                return await reply.text() if reply.status == 200 else None
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def metrics(self, request: web.Request) -> web.Response:
        workers = list(self.workers())
        texts = await asyncio.gather(*(self._read(w) for w in workers))
        body = exposition(merged(list(zip(workers, texts, strict=True))))
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
