"""Durable runs (docs/durable-runs.md): what a background response pays, and how fast it moves.

- `background_checkpoint_ms_per_turn_sqlite` / `_postgres`: the wall time a turn of a background
  response waits for its checkpoint (the turn's events not yet written and the Response of a few
  KB with the counters, in one write), through the RunLog, in this process. PostgreSQL is the
  tests' throwaway cluster (tests/pg.py: fsync off) unless ANTWORT_TEST_POSTGRES_URL names one.
- `attach_first_event_ms_p50`: AttachResponse → its first replayed event, on a real
  `antwort-grpc serve` (SQLite) holding an ended background response.
- `attach_replay_cpu_us_per_event`: that gateway's CPU per event replaying a finished log of
  about 500 events whole, one event per message; `attach_replay_cpu_ratio_batched`: the same
  with `batch_events` ÷ without.
- `takeover_s`: kill -9 of the replica running a background response → the `recovered` event on
  a client attached through the other replica (PostgreSQL, lease 2 s): the lease is in it, and
  at most the lease (the survivor looks when the dead replica's lease runs out).
- `takeover_s_default_lease`: the same at the default lease (10 s), one round: the bound the
  docs give is the lease (+ 1 s for the claim and the resumed run's first event).
- `handover_s`: SIGTERM of that replica → the `recovered` event (no lease wait).

Run alone: `python -m bench.run --only durable` (with --tiny: the SQLite and attach figures only).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from antwort_grpc import pb
from antwort_grpc.storage.options import StoreOptions
from antwort_grpc.storage.runlog import Checkpoint
from bench.figures import Scale
from bench.procs import Child
from bench.stats import Results, percentile

LEASE = 2.0
DEFAULT_LEASE = 10.0
TURN_EVENTS = 40


def _response() -> bytes:
    """A Response of a few turns: about 4 KB."""
    response = pb.Response(id="resp_bench", model="bench", status=pb.ResponseStatus.RESPONSE_STATUS_IN_PROGRESS)
    for n in range(8):
        part = pb.ContentPart(output_text=pb.OutputText(text="word " * 100))
        response.output.append(pb.Item(id=f"msg_{n}", message=pb.Message(content=[part])))
    return response.SerializeToString()


async def _checkpoints(store: Any, turns: int) -> list[float]:
    log = store.runlog
    await log.begin("resp_bench", "", b"request", 60.0)
    response = _response()
    seq = 0
    took: list[float] = []
    for turn in range(turns):
        events = [(seq + n + 1, b"x" * 60) for n in range(TURN_EVENTS)]
        seq += TURN_EVENTS
        started = time.perf_counter()
        # As the runner writes a turn boundary: the events not yet written and the checkpoint.
        await log.append("resp_bench", events, checkpoint=Checkpoint(response, turn, 0, seq))
        took.append((time.perf_counter() - started) * 1e3)
    return took


async def checkpoint_cost(turns: int, results: Results, postgres: bool = True) -> None:
    from antwort_grpc.storage.postgres import PostgresStore
    from antwort_grpc.storage.sqlite import SQLiteStore
    from tests.pg import postgres_server
    from tests.storage.conftest import empty_database

    with tempfile.TemporaryDirectory() as tmp:
        sqlite = await SQLiteStore.open(Path(tmp) / "bench.db", StoreOptions(maintenance_interval=3600))
        try:
            await _checkpoints(sqlite, 5)  # warm-up
            results.add(
                "background_checkpoint_ms_per_turn_sqlite", statistics.median(await _checkpoints(sqlite, turns))
            )
        finally:
            await sqlite.close()
    if not postgres:
        return
    with postgres_server() as admin:
        async with empty_database(admin) as url:
            postgres = await PostgresStore.open(url, StoreOptions(maintenance_interval=3600))
            try:
                await _checkpoints(postgres, 5)
                took = await _checkpoints(postgres, turns)
                results.add("background_checkpoint_ms_per_turn_postgres", statistics.median(took))
            finally:
                await postgres.close()


async def _background(stub: Any, text: str) -> str:
    request = pb.CreateResponseRequest(input_text=text, background=True)
    messages = [m async for m in stub.CreateResponse(request)]
    return str(messages[0].event.created.response.id)


async def attach_latency(backend_url: str, attaches: int, results: Results) -> None:
    from tests.storage.processes import gateway_process

    with tempfile.TemporaryDirectory() as tmp:
        async with gateway_process(f"sqlite:///{tmp}/bench.db", backend_url) as gateway:
            response_id = await _background(gateway.stub, "hello")
            # Read to its end once: the response has ended, its whole log is kept.
            async with asyncio.timeout(30):
                [m async for m in gateway.stub.AttachResponse(pb.AttachResponseRequest(response_id=response_id))]
            took = []
            for _ in range(attaches):
                started = time.perf_counter()
                call = gateway.stub.AttachResponse(pb.AttachResponseRequest(response_id=response_id))
                await call.read()
                took.append((time.perf_counter() - started) * 1e3)
                call.cancel()
            results.add("attach_first_event_ms_p50", percentile(took, 50))
            await _replay_cost(gateway, max(2, attaches // 10), results)


REPLAY_WORDS = 500


async def _replay_cost(gateway: Any, replays: int, results: Results) -> None:
    """A finished log of about 500 events replayed whole, one event per message and batched
    (AttachResponseRequest.batch_events): the gateway's CPU per replayed event of each."""
    from bench.backend import model_name
    from bench.procs import cpu_seconds

    request = pb.CreateResponseRequest(
        model=model_name(words=REPLAY_WORDS), input_text="talk", background=True,
        delta_coalescing=pb.DeltaCoalescing(disabled=True),
    )  # fmt: skip
    response_id = (await anext(aiter(gateway.stub.CreateResponse(request)))).event.created.response.id
    every = pb.AttachResponseRequest(response_id=response_id)
    async with asyncio.timeout(60):
        events = len([m async for m in gateway.stub.AttachResponse(every)])  # it ends: the log is whole
    cpu = {}
    for batched in (False, True):
        attach = pb.AttachResponseRequest(response_id=response_id, batch_events=batched)
        before = cpu_seconds(gateway.process.pid)
        for _ in range(replays):
            async with asyncio.timeout(60):
                async for _message in gateway.stub.AttachResponse(attach):
                    pass
        cpu[batched] = (cpu_seconds(gateway.process.pid) - before) / replays / events
    results.add("attach_replay_cpu_us_per_event", cpu[False] * 1e6, "µs")
    results.add("attach_replay_cpu_ratio_batched", cpu[True] / cpu[False])


@contextlib.asynccontextmanager
async def _replicas(url: str, backend_url: str, lease: float = LEASE) -> AsyncIterator[tuple[Any, Any]]:
    from tests.storage.processes import gateway_process

    env = {"ANTWORT_BACKGROUND_LEASE_SECONDS": str(lease), "ANTWORT_SHUTDOWN_GRACE": "30"}
    async with gateway_process(url, backend_url, **env) as a, gateway_process(url, backend_url, **env) as b:
        yield a, b


async def _recovered_after(stop: Any, attached: Any) -> float:
    """Seconds from `stop()` to the `recovered` event on the attached stream."""
    started = time.perf_counter()
    stop()
    async with asyncio.timeout(60):
        while True:
            message = await attached.read()
            if message.event.WhichOneof("event") == "recovered":
                return time.perf_counter() - started
    raise AssertionError("no recovered event")


async def moving(backend: Child, rounds: int, results: Results) -> None:
    from bench.backend import model_name
    from tests.pg import postgres_server
    from tests.storage.conftest import empty_database

    slow = model_name(words=2000, delay=0.02)
    moves = [(signal.SIGKILL, "takeover_s", LEASE), (signal.SIGTERM, "handover_s", LEASE)] * rounds
    # The default lease once: ten seconds and more a round.
    moves.append((signal.SIGKILL, "takeover_s_default_lease", DEFAULT_LEASE))
    with postgres_server() as admin:
        for how, figure, lease in moves:
            async with empty_database(admin) as url, _replicas(url, backend.url, lease) as (a, b):
                request = pb.CreateResponseRequest(model=slow, input_text="talk", background=True)
                messages = [m async for m in a.stub.CreateResponse(request)]
                response_id = messages[0].event.created.response.id
                attached = b.stub.AttachResponse(pb.AttachResponseRequest(response_id=response_id))
                await attached.read()
                await asyncio.sleep(0.5)  # mid-turn
                results.add(figure, await _recovered_after(lambda h=how: a.process.send_signal(h), attached))
                attached.cancel()


async def durable_runs(scale: Scale, results: Results, backend: Child) -> None:
    if scale.rounds <= 1:
        # Tiny (the smoke test): SQLite and attach only; PostgreSQL and the lease waits take a
        # minute of their own.
        await checkpoint_cost(20, results, postgres=False)
        await attach_latency(backend.url, 5, results)
        return
    await checkpoint_cost(200, results)
    await attach_latency(backend.url, 100, results)
    await moving(backend, 3, results)
