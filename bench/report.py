"""bench/RESULTS.md: the latest run as a table against the targets, and one history row per run.

Only the parts between the markers are rewritten; everything else in the file is kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Row:
    figure: str
    key: str
    what: str
    op: str = ""  # ">=" or "<=", empty: no target
    target: float = 0.0

    def met(self, value: float | None) -> str:
        if not self.op:
            return ""
        if value is None:
            return "not run"
        ok = value >= self.target if self.op == ">=" else value <= self.target
        return "met" if ok else "**missed**"


ROWS = [
    Row("1 stream", "stream_throughput_ratio", "events/s of CreateResponse ÷ bare grpc.aio streaming", ">=", 0.8),
    Row("1 stream", "stream_cpu_vs_echo", "server CPU per event: bare grpc.aio ÷ gateway"),
    Row("1 stream", "stream_gateway_cpu_us_per_event", "gateway CPU per streamed event (µs)"),
    Row("2 overhead", "added_latency_p50_ms", "added latency p50, non-streaming, concurrency 1 (ms)", "<=", 2),
    Row("2 overhead", "added_latency_p99_ms", "added latency p99 (ms, all rounds pooled)"),
    Row("2 overhead", "gateway_latency_p50_ms", "gateway latency p50 (ms)"),
    Row("2 overhead", "direct_latency_p50_ms", "direct latency p50 (ms)"),
    Row("2 overhead", "grpc_floor_latency_p50_ms", "bare grpc.aio call of one message, latency p50 (ms): the floor"),
    Row("2 overhead", "client_cpu_ms_per_request_gateway", "client CPU per request, grpc.aio client (ms)"),
    Row("2 overhead", "client_cpu_ms_per_request_direct", "client CPU per request, aiohttp client (ms)"),
    Row("2 overhead", "added_ttfe_ms", "added time to the first token event (ms)", "<=", 1),
    Row("2 overhead", "added_ttfe_over_floor_ms", "the same less the bare grpc.aio call's p50: the gateway's own (ms)"),
    Row("2 overhead", "gateway_created_event_ms", "time to the gateway's first event, `created` (ms)"),
    Row("2 overhead", "throughput_ratio_c1", "requests/s ÷ direct, concurrency 1", ">=", 0.5),
    Row("2 overhead", "throughput_ratio_c32", "requests/s ÷ direct, concurrency 32", ">=", 0.5),
    Row("2 overhead", "gateway_cpu_ms_per_request", "gateway CPU per request, concurrency 1 (ms)", "<=", 2),
    Row("2 overhead", "gateway_cpu_ms_per_request_c32", "gateway CPU per request, concurrency 32 (ms)", "<=", 2),
    Row(
        "2 overhead", "loadgen_cpu_ms_per_request_c32_gateway", "the Go load generator's CPU per request beside it (ms)"
    ),
    Row(
        "2 overhead", "stream_cpu_ratio", "gateway CPU per streamed request ÷ per non-streamed, same answer", "<=", 1.3
    ),
    Row(
        "2 overhead",
        "stream_cpu_ratio_batched",
        "the same, the client asking for batched events",
        "<=",
        1.3,
    ),
    Row("2 overhead", "gateway_cpu_ms_per_streamed_request", "gateway CPU per streamed request, 20 words (ms)"),
    Row("3 tools", "parallel_tools_ratio", "8 tool calls of 200 ms, in-process executor: time ÷ 200 ms", "<=", 1.2),
    Row("3 tools", "parallel_tools_ratio_remote", "the same through a ToolExecutorService over gRPC", "<=", 1.2),
    Row("4 concurrency", "concurrency_errors", "failed or incomplete conversations (of 1,000 held open)", "<=", 0),
    Row("4 concurrency", "concurrency_peak_open", "calls open at once (peak)"),
    Row("4 concurrency", "concurrency_peak_streaming", "conversations receiving tokens at once (peak)"),
    Row("4 concurrency", "rss_per_stream_kb", "gateway memory growth per open stream (KiB)", "<=", 100),
    Row("4 concurrency", "token_lag_p99_ms", "backend writes a token → client has its event, p99 (ms)", "<=", 50),
    Row(
        "4 concurrency",
        "gateway_cpu_us_per_token_1000_streams",
        "gateway CPU ÷ tokens delivered, 1,000 streams at 10 tokens/s each (µs)",
        "<=",
        30,
    ),
    Row(
        "4 concurrency", "loadgen_cpu_us_per_token_1000_streams", "the Go load generator's CPU per token beside it (µs)"
    ),
    Row("4 concurrency", "tokens_per_delta_event_1000_streams", "tokens per delta event (coalescing under load)"),
    Row("4 concurrency", "token_lag_p50_ms", "the same, p50 (ms)"),
    Row("4 concurrency", "token_lag_p99_ms_held", "the same, p99, only while all 1,000 receive tokens (ms)"),
    Row("4 concurrency", "concurrency_busiest_cores", "gateway + backend + client CPU, busiest second (cores of 2)"),
    Row("4 concurrency", "concurrency_busiest_gateway_cores", "the gateway's share of it (cores)"),
    Row("4 concurrency", "concurrency_held_s", "how long all 1,000 were receiving tokens at once (s)"),
    Row(
        "4 concurrency",
        "concurrency_all_streaming",
        "1: all 1,000 received tokens at once (the held figures are valid); 0: invalid",
        ">=",
        1,
    ),
    Row("4 concurrency", "concurrency_tokens_per_turn", "tokens per turn it took to get there (40: none added)"),
    Row(
        "4 concurrency",
        "echo_cpu_us_per_message_1000_streams",
        "bare grpc.aio server, 1,000 streams at the same pace: CPU per message (µs)",
    ),
    Row(
        "4 concurrency",
        "gateway_cpu_per_token_vs_echo_1000_streams",
        "gateway CPU per token ÷ the bare server's per message, 1,000 streams",
        "<=",
        1.5,
    ),
    Row("5 growth", "turn_cost_ratio_10_vs_1", "CPU of a 10-turn response ÷ 10 x a 1-turn response", "<=", 1.2),
    Row("5 growth", "turn_cost_ratio_5_vs_1", "CPU of a 5-turn response ÷ 5 x a 1-turn response", "<=", 1.2),
    Row("5 growth", "chain50_cost_ratio", "CPU of a request on a 50-response chain ÷ one without"),
    Row("5 growth", "chain_growth_full_vs_half", "added CPU of the 50-chain ÷ the 25-chain (linear: 2)", "<=", 2.5),
    Row("5 growth", "turn_cost_ms_1", "gateway CPU per turn, 1-turn responses (ms)"),
    Row("5 growth", "turn_cost_ms_5", "gateway CPU per turn, 5-turn responses (ms)"),
    Row("5 growth", "turn_cost_ms_10", "gateway CPU per turn, 10-turn responses (ms)"),
    Row("6 interactive", "bidi_stream_throughput_ratio", "events/s of Converse ÷ bare grpc.aio streaming", ">=", 0.8),
    Row("6 interactive", "steer_latency_ms_p50", "steer sent → first text of the steered turn, p50 (ms)"),
    Row("6 interactive", "steer_latency_ms_p99", "the same, p99 (ms)"),
    Row("6 interactive", "steer_backend_first_text_ms", "the backend's own time to first text, direct (ms)"),
    Row("6 interactive", "steer_added_ms_p50", "steer latency p50 minus the backend time to first text (ms)", "<=", 5),
    Row(
        "7 observability",
        "observability_cpu_ratio",
        "gateway CPU per request, metrics + traces (parent-based, 10 % of roots) on ÷ off",
        "<=",
        1.10,
    ),
    Row("7 observability", "observability_full_cpu_ratio", "the same, every trace sampled"),
    Row("7 observability", "metrics_cpu_ratio", "gateway CPU per request, metrics alone on ÷ off"),
    Row("7 observability", "observability_cpu_ms_per_request", "gateway CPU per streamed request, observed (ms)"),
    Row("7 observability", "plain_cpu_ms_per_request", "the same, nothing observed (ms)"),
    Row("7 observability", "jwt_auth_cpu_ratio", "gateway CPU per request, JWT authentication ÷ none"),
    Row("7 observability", "jwt_auth_cpu_us_per_request", "CPU one JWT check adds to a request (µs)"),
    Row("8 hooks", "hooks_overhead_ms_per_turn", "a HookService on every point: time added per turn (ms)", "<=", 1.5),
    Row("8 hooks", "hooks_turn_time_ratio", "turn time with that hook service ÷ without"),
    Row(
        "8 hooks",
        "hooks_local_overhead_ms_per_turn",
        "the same hook in the gateway's process: time added per turn (ms)",
    ),
    Row("8 hooks", "hooks_none_ms_per_turn", "turn time without hooks (ms; a tool call and an answer per 2 turns)"),
    Row(
        "9 durable",
        "background_checkpoint_ms_per_turn_sqlite",
        "a background turn's checkpoint, SQLite: log flush + checkpoint (ms)",
        "<=",
        1,
    ),
    Row(
        "9 durable",
        "background_checkpoint_ms_per_turn_postgres",
        "the same, PostgreSQL (the tests' cluster, fsync off) (ms)",
        "<=",
        2,
    ),
    Row("9 durable", "attach_first_event_ms_p50", "AttachResponse → first replayed event, p50 (ms)", "<=", 5),
    Row("9 durable", "attach_replay_cpu_us_per_event", "replaying a finished log of ~500 events: CPU per event (µs)"),
    Row("9 durable", "attach_replay_cpu_ratio_batched", "the same with batch_events ÷ one event per message"),
    Row("9 durable", "takeover_s", "kill -9 of the running replica → recovered on the other (s, lease 2 s)", "<=", 3),
    Row(
        "9 durable",
        "takeover_s_default_lease",
        "the same at the default lease (s, lease 10 s, one round)",
        "<=",
        11,
    ),
    Row("9 durable", "handover_s", "SIGTERM of the running replica → recovered on the other (s)", "<=", 1),
    Row("10 http", "http_stream_cpu_ratio", "gateway CPU per streamed event, HTTP/SSE door ÷ gRPC door", "<=", 1.5),
    Row("10 http", "http_cpu_us_per_streamed_event", "gateway CPU per event streamed over HTTP/SSE (µs)"),
    Row("10 http", "grpc_cpu_us_per_streamed_event_same_run", "the same over gRPC, same run (µs)"),
    Row(
        "10 http", "http_added_latency_p50_ms", "non-streamed request via the HTTP door minus direct, p50 (ms)", "<=", 2
    ),
    Row("10 http", "grpc_added_latency_p50_ms_same_run", "the same via the gRPC door, same run (ms)"),
    Row(
        "11 overload", "overload_cancelled_streams", "streams ended CANCELLED or cut without a terminal event", "<=", 0
    ),
    Row("11 overload", "overload_dropped_streams", "streams neither completed nor refused with pushback", "<=", 0),
    Row("11 overload", "overload_series_max_streams", "the largest step: streams opened at once", ">=", 4000),
    Row("11 overload", "overload_base_streams", "1x: what one gateway process carries (its running cap)"),
    *(
        Row("11 overload", f"overload_{kind}_{m}x", f"{m}x: streams {what}")
        for m in (1, 2, 4, 8)
        for kind, what in (("completed", "completed"), ("refused", "refused before they started"))
    ),
    *(
        Row("11 overload", f"overload_lag_p99_ms_{m}x", f"{m}x: token lag p99 of the streams served (ms)")
        for m in (1, 2, 4, 8)
    ),
    Row(
        "12 workers",
        "workers_capacity_ratio",
        "streams carried at token lag p99 <= 100 ms: 2 worker processes ÷ 1 (client on the same cores)",
        ">=",
        1.6,
    ),
    Row("12 workers", "workers_carried_streams_1", "streams carried at lag p99 <= 100 ms, 1 worker"),
    Row("12 workers", "workers_carried_streams_2", "the same, 2 workers"),
    *(
        Row(
            "12 workers", f"workers_{what}_cores_{n}", f"{n} worker(s), largest step carried: {who} (cores of the step)"
        )
        for n in (1, 2)
        for what, who in (("gateway", "the gateway's processes"), ("others", "the Go backend + client"))
    ),
    Row("12 workers", "workers_split_2", "CPU of the least busy worker ÷ the busiest's (the kernel's spread)"),
]

HISTORY_KEYS = [
    "stream_throughput_ratio",
    "added_latency_p50_ms",
    "added_ttfe_ms",
    "gateway_cpu_ms_per_request",
    "throughput_ratio_c1",
    "throughput_ratio_c32",
    "parallel_tools_ratio",
    "concurrency_errors",
    "rss_per_stream_kb",
    "token_lag_p99_ms",
    "gateway_cpu_us_per_token_1000_streams",
    "gateway_cpu_per_token_vs_echo_1000_streams",
    "stream_cpu_ratio",
    "turn_cost_ratio_10_vs_1",
    "chain50_cost_ratio",
]

_LATEST = ("<!-- latest:begin -->", "<!-- latest:end -->")
_HISTORY = ("<!-- history:begin -->", "<!-- history:end -->")


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def latest_table(data: dict[str, Any]) -> str:
    details = data.get("details", {})
    lines = [
        f"Run of {data['date']} on **{data['machine']}**, commit `{data['commit']}`, "
        f"load average {data.get('load_average_at_start', '?')} at the start, {data.get('duration_s', '?')} s.",
        "",
        "| figure | key | what | target | median | spread (min - max, runs) | |",
        "| --- | --- | --- | ---: | ---: | --- | --- |",
    ]
    for row in ROWS:
        value = data.get(row.key)
        detail = details.get(row.key, {})
        spread = (
            f"{_fmt(detail.get('min'))} - {_fmt(detail.get('max'))}, {len(detail.get('runs', []))}" if detail else ""
        )
        target = f"{row.op} {row.target:g}" if row.op else ""
        lines.append(
            f"| {row.figure} | `{row.key}` | {row.what} | {target} | {_fmt(value)} | {spread} | {row.met(value)} |"
        )
    return "\n".join(lines)


def history_row(data: dict[str, Any]) -> str:
    cells = [data["date"][:16].replace("T", " "), f"`{data['commit']}`", str(data.get("load_average_at_start", ""))]
    cells += [_fmt(data.get(k)) for k in HISTORY_KEYS]
    return "| " + " | ".join(cells) + " |"


def history_header() -> str:
    names = ["date (UTC)", "commit", "load", *HISTORY_KEYS]
    return "| " + " | ".join(names) + " |\n|" + " --- |" * len(names)


def update(path: Path, data: dict[str, Any]) -> None:
    text = path.read_text() if path.exists() else _skeleton()
    text = _replace(text, _LATEST, latest_table(data))
    begin, end = _HISTORY
    match = re.search(re.escape(begin) + r"\n(.*?)" + re.escape(end), text, re.S)
    rows = [line for line in (match.group(1).splitlines() if match else []) if line.startswith("| 20")]
    if data.get("scale") != "tiny":
        rows.append(history_row(data))
    text = _replace(text, _HISTORY, history_header() + "\n" + "\n".join(rows))
    path.write_text(text)


def _replace(text: str, markers: tuple[str, str], body: str) -> str:
    begin, end = markers
    block = f"{begin}\n{body}\n{end}"
    if begin in text and end in text:
        return re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    return text.rstrip() + "\n\n" + block + "\n"


def _skeleton() -> str:
    latest = "\n".join(_LATEST)
    history = "\n".join(_HISTORY)
    return f"# Benchmark results\n\n## Latest run\n\n{latest}\n\n## History\n\n{history}\n"


def summary(data: dict[str, Any]) -> str:
    """The headline figures against their targets, for the terminal."""
    lines = []
    for row in ROWS:
        if row.key in data:
            target = f"{row.op} {row.target:g}" if row.op else ""
            lines.append(f"{row.key:36} {_fmt(data[row.key]):>10}  {target:8} {row.met(data[row.key])}")
    return "\n".join(lines)
