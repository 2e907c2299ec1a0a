"""Overload: 1x, 2x, 4x and 8x the streams one gateway process carries, all opened at once, each
stream told apart by how it ended — completed with all its events, refused before it started
(RESOURCE_EXHAUSTED with pushback), or dropped (anything else: CANCELLED without a terminal event,
a failed or short stream).

The base is what one process carries: its running cap (512 by default, sized to keep the token
lag p99 near 100 ms at 10 tokens a second; docs/limits.md), set on the gateway explicitly so the
tiny run refuses too. The streams are the held-streams figure's (the Go load generator, the Go
backend writing stamped tokens at its pace, two turns each), one gateway for the series (each
step's streams have ended before the next starts).

`overload_cancelled_streams`: streams of the whole series ended CANCELLED or cut without a
terminal event (the failure past capacity: must be 0); `overload_dropped_streams`: every stream
neither completed nor refused; `overload_series_max_streams`: the largest step's count. Per step
(`_1x` … `_8x`): completed, refused, dropped, and the token lag p99 of what was served.
"""

from __future__ import annotations

import os
from typing import Any

from bench import loadgen
from bench.backend import model_name
from bench.figures import Scale, gateway
from bench.procs import Child
from bench.stats import Results, percentile

MULTIPLES = (1, 2, 4, 8)
# What one process carries by default (ANTWORT_MAX_RUNNING_RESPONSES' default); the tiny run's own.
BASE = 512
TINY_BASE = 4


def outcome(stream: dict[str, Any], tokens: int) -> str:
    """completed, refused, cancelled, or dropped (any other end)."""
    error = stream.get("error", "")
    if stream["terminal"] == "completed" and stream["sequence_ok"] and stream["tokens"] == 2 * tokens:
        return "completed"
    if "code = ResourceExhausted" in error and stream["events"] == 0:
        return "refused"
    if "code = Canceled" in error or (error and not stream["terminal"]):
        return "cancelled"
    return "dropped"


async def overload_series(scale: Scale, results: Results, backend: Child) -> None:
    tiny = scale.streams <= 16
    # Another host's own base (a larger cap, several workers) without editing the figure.
    base = TINY_BASE if tiny else int(os.environ.get("BENCH_OVERLOAD_BASE", BASE))
    tokens = scale.tokens
    cancelled = dropped = 0
    async with (
        loadgen.backend() as go_backend,
        gateway("--provider", "openai", "--backend-url", go_backend.url, "--max-running", str(base)) as gw,
    ):
        for multiple in MULTIPLES:
            counts, lag_p99 = await _step(gw, base * multiple, tokens, scale.token_delay)
            cancelled += counts["cancelled"]
            dropped += counts["cancelled"] + counts["dropped"]
            for kind in ("completed", "refused"):
                results.add(f"overload_{kind}_{multiple}x", counts[kind])
            results.add(f"overload_dropped_{multiple}x", counts["cancelled"] + counts["dropped"])
            results.add(f"overload_lag_p99_ms_{multiple}x", lag_p99, "ms")
    results.add("overload_cancelled_streams", cancelled)
    results.add("overload_dropped_streams", dropped)
    results.add("overload_series_max_streams", base * MULTIPLES[-1])
    results.add("overload_base_streams", base)


async def _step(gw: Child, count: int, tokens: int, delay: float) -> tuple[dict[str, int], float]:
    model = model_name(words=tokens, delay=delay, tools=1, stamp=True)
    report = await loadgen.run("-mode", "stream", "-target", gw.target, "-model", model, "-tools", "-stamped",
                               "-n", str(count), "-c", str(count))  # fmt: skip
    counts = dict.fromkeys(("completed", "refused", "cancelled", "dropped"), 0)
    for stream in report["streams"]:
        counts[outcome(stream, tokens)] += 1
    lags: list[int] = report["lags_ns"]
    return counts, (percentile(lags, 99) / 1e6 if lags else 0.0)
