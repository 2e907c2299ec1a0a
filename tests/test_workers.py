"""`serve --workers N` without PostgreSQL: the stores that serve one process refuse more workers in
one line and make the default one; and the parts of the supervisor on their own (the plan, the
reserved ports, the merged metrics). The workers themselves: tests/storage/test_workers.py."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from antwort_grpc import machine
from antwort_grpc.config import GatewaySettings
from antwort_grpc.startup_errors import StartupError
from antwort_grpc.workers import plan
from antwort_grpc.workers.metrics import WorkerMetrics, exposition, merged
from antwort_grpc.workers.ports import reserve

ANTWORT = str(Path(sys.executable).parent / "antwort-grpc")
SCRIPT = {"turns": [{"outputs": [{"text": "hello"}]}], "repeat": True}


async def run_serve(tmp_path: Path, *args: str, **env: str) -> tuple[int | None, str]:
    """`antwort-grpc serve` with a script: its exit code (None: it served, then got SIGTERM) and output."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    process = await asyncio.create_subprocess_exec(
        ANTWORT, "serve", "--listen", "127.0.0.1:0", "--http-listen", "off", "--script", str(script),
        "--data-dir", str(tmp_path), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={"PATH": "/usr/bin:/bin", **env},
    )  # fmt: skip
    assert process.stdout is not None
    output: list[str] = []
    async with asyncio.timeout(60):
        async for raw in process.stdout:
            output.append(raw.decode())
            if "serving on" in output[-1]:
                process.terminate()
        code = await process.wait()
    served = any("serving on" in line for line in output)
    return (None if served else code), "".join(output)


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--workers", "2", "--store", "sqlite:///{tmp}/one.db"], {}, "the SQLite store"),
        ([], {"ANTWORT_WORKERS": "3", "ANTWORT_STORE": "memory"}, "the memory store"),
    ],
    ids=["sqlite_flag", "memory_variable"],
)
async def test_more_than_one_worker_on_a_store_of_one_process_is_refused_in_one_line(
    tmp_path: Path, args: list[str], env: dict[str, str], named: str
) -> None:
    code, output = await run_serve(tmp_path, *[a.replace("{tmp}", str(tmp_path)) for a in args], **env)
    assert code == 2, output
    [line] = output.strip().splitlines()
    assert line.startswith("antwort-grpc serve: --workers / ANTWORT_WORKERS: "), line
    assert named in line and "ANTWORT_STORE=postgresql://" in line, line


async def test_the_default_on_sqlite_is_one_process_and_a_line_names_the_store(tmp_path: Path) -> None:
    code, output = await run_serve(tmp_path)
    assert code is None, output
    assert f"one worker process: the SQLite store {tmp_path / 'antwort.db'} serves one process" in output
    assert "worker 0 serving" not in output, "no supervisor: the gateway is the process itself"


def settings(**values: object) -> GatewaySettings:
    return GatewaySettings(**values)  # type: ignore[arg-type]


def test_the_default_is_one_worker_per_usable_core_bounded_by_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    pg = settings(store="postgresql://db/antwort")
    monkeypatch.setattr(machine, "machine_cores", lambda: 8.0)
    monkeypatch.setattr(machine, "memory_bytes", lambda: 64 * 2**30)
    assert plan.planned(pg) == (8, None)
    # A pod with a memory limit of 1 GiB and no CPU limit sees its node's cores.
    monkeypatch.setattr(machine, "memory_bytes", lambda: 2**30)
    assert plan.planned(pg) == (2, None)
    monkeypatch.setattr(machine, "machine_cores", lambda: 1.5)  # a CPU quota of 1.5 cores
    assert plan.planned(pg) == (1, None)
    assert plan.planned(settings(store="postgresql://db/antwort", workers=5)) == (5, None)
    assert plan.planned(settings(store="", workers=1)) == (1, None)
    count, why = plan.planned(settings(store="memory"))
    assert count == 1 and why is not None and "the memory store" in why
    with pytest.raises(StartupError, match="--workers / ANTWORT_WORKERS"):
        plan.planned(settings(store="sqlite:///x.db", workers=2))


def test_each_worker_gets_its_share_of_the_gateway_wide_limits_that_were_set() -> None:
    parent = settings(store="postgresql://db/a", max_running_responses=1000, metrics_listen="0.0.0.0:9464", model="m")
    values = plan.worker_settings(parent, 3, "0.0.0.0:50051", "off")
    assert values["max_running_responses"] == 334 and "memory_budget_bytes" not in values
    assert values["metrics_listen"] == "127.0.0.1:0" and values["http_listen"] == "off"
    assert GatewaySettings(**values).model == "m"


def test_a_share_of_the_machine_is_what_a_worker_sizes_its_defaults_by() -> None:
    cores, memory = machine.cpu_cores(), machine.memory_bytes()
    machine.share(4)
    try:
        assert machine.cpu_cores() == cores / 4 and machine.memory_bytes() == memory // 4
        assert machine.machine_cores() == cores
    finally:
        machine.share(1)


def test_a_port_is_reserved_for_every_worker_and_one_in_use_is_refused() -> None:
    reserved = reserve("127.0.0.1:0", "--listen")
    try:
        assert reserved.port > 0 and reserved.listen == f"127.0.0.1:{reserved.port}"
        # Another process's listener: refused, as with one process.
        with socket.socket() as other:
            other.bind(("127.0.0.1", 0))
            other.listen()
            with pytest.raises(StartupError, match=r"cannot listen on .* --listen"):
                reserve(f"127.0.0.1:{other.getsockname()[1]}", "--listen")
        # The reservation itself takes no connection: it never listens.
        with socket.socket() as client, pytest.raises(ConnectionRefusedError):
            client.connect(("127.0.0.1", reserved.port))
    finally:
        reserved.close()


def exposition_of(requests: float, streams: float) -> str:
    registry = CollectorRegistry()
    Counter("grpc_server_started", "RPCs started", ["grpc_method"], registry=registry).labels("Get").inc(requests)
    Gauge("antwort_open_streams", "Streams open", registry=registry).set(streams)
    return generate_latest(registry).decode()


def test_the_merged_metrics_label_every_workers_series_and_say_which_answered() -> None:
    workers = [WorkerMetrics(0, 1, 0), WorkerMetrics(1, 2, 3), WorkerMetrics(2, None, 1)]
    text = exposition(
        merged([(workers[0], exposition_of(2, 5)), (workers[1], exposition_of(7, 1)), (workers[2], None)])
    )
    lines = text.decode().splitlines()
    assert 'grpc_server_started_total{grpc_method="Get",worker="0"} 2.0' in lines
    assert 'grpc_server_started_total{grpc_method="Get",worker="1"} 7.0' in lines
    assert 'antwort_open_streams{worker="0"} 5.0' in lines and 'antwort_open_streams{worker="1"} 1.0' in lines
    assert lines.count("# TYPE antwort_open_streams gauge") == 1
    assert 'antwort_worker_up{worker="2"} 0.0' in lines and 'antwort_worker_up{worker="1"} 1.0' in lines
    assert 'antwort_worker_restarts_total{worker="1"} 3.0' in lines


async def test_workers_that_cannot_start_end_the_parent_with_their_reason_and_its_line(tmp_path: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nobody = f"postgresql://postgres@127.0.0.1:{closed.getsockname()[1]}/antwort"  # bound, never listening
        code, output = await run_serve(tmp_path, "--workers", "2", "--store", nobody)
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 3, output
    for line in lines[:2]:
        assert line.startswith("antwort-grpc serve (worker ") and "--store / ANTWORT_STORE" in line, output
    assert re.fullmatch(r"antwort-grpc serve: worker [01] exited before it served \(exit code 2\)", lines[2]), output
