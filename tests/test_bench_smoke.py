"""`make bench` in its tiny mode: every figure runs end to end (real processes: the fake backend,
gateways, the echo server) and latest.json holds every key as a number. No timing is asserted:
the figures themselves come from `make bench` on a quiet machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import pg

ROOT = Path(__file__).resolve().parent.parent

KEYS = [
    "stream_throughput_ratio",
    "added_latency_p50_ms",
    "added_latency_p99_ms",
    "added_ttfe_ms",
    "added_ttfe_over_floor_ms",
    "gateway_cpu_ms_per_request",
    "throughput_ratio_c1",
    "throughput_ratio_c32",
    "parallel_tools_ratio",
    "parallel_tools_ratio_remote",
    "concurrency_errors",
    "rss_per_stream_kb",
    "token_lag_p99_ms",
    "gateway_cpu_us_per_token_1000_streams",
    "loadgen_cpu_us_per_token_1000_streams",
    "stream_cpu_ratio",
    "stream_cpu_vs_echo",
    "turn_cost_ratio_10_vs_1",
    "chain50_cost_ratio",
    "hooks_overhead_ms_per_turn",
    "observability_cpu_ratio",
    "jwt_auth_cpu_ratio",
    "background_checkpoint_ms_per_turn_sqlite",
    "attach_first_event_ms_p50",
    "attach_replay_cpu_ratio_batched",
    "http_stream_cpu_ratio",
    "http_added_latency_p50_ms",
    "overload_cancelled_streams",
    "overload_dropped_streams",
    "overload_series_max_streams",
    "overload_completed_1x",
    "overload_refused_8x",
    "overload_lag_p99_ms_4x",
    "workers_capacity_ratio",
    "workers_carried_streams_1",
    "workers_carried_streams_2",
]


# Every figure's processes on a shared 2-core machine: past pytest's default of 120 s under load.
@pytest.mark.timeout(300)
def test_tiny_bench_runs_every_figure_and_writes_every_key(tmp_path: Path) -> None:
    report = ROOT / "bench" / "RESULTS.md"
    before = report.read_text() if report.exists() else None
    # The Go load generator is built first (minutes on a clean machine, then cached).
    subprocess.run([str(ROOT / "bench" / "loadgen" / "build.sh")], check=True, capture_output=True, timeout=900)
    # The workers figure's PostgreSQL: Debian's package, installed first when missing.
    pg.install()
    run = subprocess.run(
        [sys.executable, "-m", "bench.run", "--tiny", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        # A guard against a hang, not a timing: the HTTP door's section added about 5 s, the
        # workers figure (a PostgreSQL cluster, two gateways) about 5 s more.
        timeout=190,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads((tmp_path / "latest.json").read_text())
    for key in KEYS:
        assert isinstance(data[key], int | float), f"{key}: {data.get(key)!r}"
    assert data["concurrency_errors"] == 0
    # Past capacity every stream is completed or refused before it starts, none dropped.
    assert data["overload_cancelled_streams"] == 0
    assert data["overload_dropped_streams"] == 0
    assert data["overload_refused_8x"] > 0
    for key in ("date", "machine", "commit"):
        assert isinstance(data[key], str) and data[key], key
    assert data["scale"] == "tiny"
    # A tiny run never touches the table of real figures.
    assert (report.read_text() if report.exists() else None) == before
