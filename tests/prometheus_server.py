"""A real Prometheus server (Debian's `prometheus` package) for the metrics tests: it scrapes
given targets and answers PromQL over its HTTP API."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from tests.executors.remote_services import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
Vector = list[dict[str, Any]]


class Prometheus:
    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url = url
        self.session = session

    async def query(self, promql: str) -> Vector:
        async with self.session.get(f"{self.url}/api/v1/query", params={"query": promql}) as reply:
            body = await reply.json()
        assert body["status"] == "success", body
        result: Vector = body["data"]["result"]
        return result

    async def until(self, promql: str, check: Callable[[Vector], bool], timeout: float = 60) -> Vector:
        """Query until `check` holds: Prometheus takes what it scrapes at its own pace."""
        result: Vector = []
        try:
            async with asyncio.timeout(timeout):
                while True:
                    result = await self.query(promql)
                    if check(result):
                        return result
                    await asyncio.sleep(0.25)
        except TimeoutError:
            raise AssertionError(f"{promql} never satisfied the check; last result {result}") from None


@asynccontextmanager
async def prometheus(tmp_path: Path, targets: list[str], interval: str = "500ms") -> AsyncIterator[Prometheus]:
    config = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval},
        "scrape_configs": [{"job_name": "antwort", "static_configs": [{"targets": targets}]}],
    }
    config_file = tmp_path / "prometheus.yml"
    config_file.write_text(json.dumps(config))  # YAML is a superset of JSON
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        PROMETHEUS,
        f"--config.file={config_file}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("wb"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            async with asyncio.timeout(60):
                while True:
                    assert proc.returncode is None, (tmp_path / "prometheus.log").read_text()[-2000:]
                    try:
                        async with session.get(f"{url}/-/ready") as reply:
                            if reply.status == 200:
                                break
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.1)
            yield Prometheus(url, session)
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


def promtool_check_metrics(exposition: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, "check", "metrics"], input=exposition, capture_output=True, text=True, timeout=60)
