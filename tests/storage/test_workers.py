"""`antwort-grpc serve --workers 2` on PostgreSQL: real processes (the parent and its two workers)
on one gRPC port and one HTTP port, the fake OpenAI-compatible backend, and the database telling
which worker ran what (each worker is a replica: its own instance id on the rows it saves)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import grpc
import pytest
import pytest_asyncio

from antwort_grpc import pb
from antwort_grpc.providers import local_model
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply
from tests.harness import assert_valid_stream, events_of, kind, kinds, output_text, response_of, user
from tests.ports import free_ports
from tests.prometheus_server import promtool_check_metrics
from tests.storage.conftest import empty_database
from tests.storage.processes import ROOT, Stream, command, environment

pytestmark = pytest.mark.asyncio(loop_scope="module")

S = pb.ResponseStatus
RUNNING = (S.RESPONSE_STATUS_QUEUED, S.RESPONSE_STATUS_IN_PROGRESS)
WORKER_LINE = re.compile(r"worker (\d+) serving \(pid (\d+)\)")


def route(body: dict[str, Any]) -> Reply:
    """By the last message's first words: `slow` streams for 20 s, `hold` waits at its third
    delta until released, anything else answers at once."""
    text = str(body["messages"][-1]["content"])
    if text.startswith("slow"):
        return Reply(text="word " * 400, delay=0.05)
    if text.startswith("hold"):
        return Reply(text="deploying to the US region now", hold_at=3)
    return Reply(text=f"answer to {text}")


class RoutedFake(FakeOpenAI):
    def __init__(self) -> None:
        super().__init__()
        self._bodies: list[dict[str, Any]] = []

    async def _chat(self, request: Any) -> Any:
        self._bodies.append(await request.json())
        return await super()._chat(request)

    def _take(self) -> Reply | None:
        return route(self._bodies.pop(0))


@dataclass
class Workers:
    """The parent process, its workers' pids, and a channel (a connection of its own) per worker."""

    process: asyncio.subprocess.Process
    target: str
    url: str
    http_port: int
    metrics_port: int
    pids: list[int]
    channels: dict[str, grpc.aio.Channel] = field(default_factory=dict)
    output: list[str] = field(default_factory=list)

    def stub(self, instance: str) -> Any:
        return pb.ResponsesServiceStub(self.channels[instance])

    def instances(self) -> list[str]:
        return sorted(self.channels)


async def instance_of(url: str, response_id: str) -> str:
    """Which worker saved the response (its store's instance id)."""
    conn = await asyncpg.connect(url)
    try:
        return str(await conn.fetchval("SELECT instance FROM antwort_responses WHERE id = $1", response_id))
    finally:
        await conn.close()


def own_connection(target: str) -> grpc.aio.Channel:
    # A subchannel pool of its own: a new TCP connection, which the kernel gives to either worker.
    return grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])


def gateway_view(gateway: Workers, instance: str) -> Any:
    """What tests.storage.processes.Stream needs of a gateway: a stub (here: one worker's)."""

    @dataclass
    class View:
        stub: Any

    return View(gateway.stub(instance))


async def one_channel_per_worker(gateway: Workers, count: int) -> None:
    """Connections until one reaches each worker (the kernel spreads them by their addresses)."""
    for _ in range(64):
        channel = own_connection(gateway.target)
        request = user("which worker?")
        request.max_output_tokens = 1  # short, when it is the embedded model that answers
        reply = [m async for m in pb.ResponsesServiceStub(channel).CreateResponse(request)]
        instance = await instance_of(gateway.url, response_of(reply[-1].event).id)
        if instance in gateway.channels:
            await channel.close()
        else:
            gateway.channels[instance] = channel
        if len(gateway.channels) == count:
            return
    raise AssertionError(f"64 connections reached {len(gateway.channels)} of {count} workers")


async def _drain(stream: asyncio.StreamReader, into: list[str]) -> None:
    async for line in stream:
        into.append(line.decode(errors="replace"))


@asynccontextmanager
async def workers_process(url: str, backend: str, count: int = 2, **env: str) -> AsyncIterator[Workers]:
    """`antwort-grpc serve --workers N` with every port on loopback, once all its workers serve."""
    http_port, metrics_port = free_ports(2)
    args = ["serve", "--workers", str(count), "--listen", "127.0.0.1:0", "--store", url]
    # No backend: the embedded local model.
    args += ["--backend-url", backend] if backend else []
    args += ["--http-listen", f"127.0.0.1:{http_port}", "--metrics-listen", f"127.0.0.1:{metrics_port}"]
    process = await asyncio.create_subprocess_exec(
        *command(*args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=environment(**({"ANTWORT_MODEL": "fake-model"} if backend else {}), **env),
        cwd=ROOT,
        # A group of its own, as a terminal gives a command: Ctrl-C is sent to the group.
        process_group=0,
    )
    assert process.stdout is not None
    output: list[str] = []
    target = ""
    async with asyncio.timeout(60):
        while not target:
            line = (await process.stdout.readline()).decode()
            assert line, "serve exited before it was ready:\n" + "".join(output)
            output.append(line)
            if "serving on" in line and "worker" not in line:
                target = line.rsplit(" ", 1)[1].strip()
    pids = [int(found.group(2)) for found in map(WORKER_LINE.search, output) if found]
    drain = asyncio.create_task(_drain(process.stdout, output))
    gateway = Workers(process, target, url, http_port, metrics_port, pids, output=output)
    try:
        yield gateway
    finally:
        for channel in gateway.channels.values():
            await channel.close()
        if process.returncode is None:
            process.terminate()
            async with asyncio.timeout(30):
                await process.wait()
        drain.cancel()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fake() -> AsyncIterator[RoutedFake]:
    async with RoutedFake() as server:
        yield server


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(postgres_admin_url: str, fake: RoutedFake) -> AsyncIterator[Workers]:
    async with empty_database(postgres_admin_url) as url, workers_process(url, fake.url) as started:
        await one_channel_per_worker(started, 2)
        yield started


async def test_two_workers_serve_creates_on_one_grpc_port_and_one_http_port(gateway: Workers) -> None:
    assert len(gateway.pids) == 2 and gateway.process.pid not in gateway.pids
    assert len(gateway.instances()) == 2, "connections to the one gRPC port reached both workers"

    async def http_create(index: int) -> str:
        # A connection of its own each (force_close): the kernel spreads connections, not requests.
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            body = {"model": "fake-model", "input": f"http {index}"}
            async with session.post(f"http://127.0.0.1:{gateway.http_port}/v1/responses", json=body) as reply:
                assert reply.status == 200, await reply.text()
                answer = await reply.json()
        assert answer["status"] == "completed"
        assert answer["output"][0]["content"][0]["text"] == f"answer to http {index}"
        return await instance_of(gateway.url, answer["id"])

    served = await asyncio.gather(*(http_create(i) for i in range(24)))
    assert set(served) == set(gateway.instances()), "connections to the one HTTP port reached both workers"


async def test_a_cancel_sent_to_one_worker_ends_a_stream_running_in_the_other(gateway: Workers) -> None:
    runs_in, other = gateway.instances()
    stream = Stream(gateway_view(gateway, runs_in), user("slow, please"))
    await stream.wait_for_deltas(3)
    assert await instance_of(gateway.url, stream.response_id) == runs_in

    reply = await gateway.stub(other).CancelResponse(pb.CancelResponseRequest(response_id=stream.response_id))
    assert reply.response.status == S.RESPONSE_STATUS_CANCELLED
    events = await stream.finished()
    assert_valid_stream(events)
    assert kinds(events)[-1] == "cancelled"
    stored = await gateway.stub(other).GetResponse(pb.GetResponseRequest(response_id=stream.response_id))
    assert stored.response.status == S.RESPONSE_STATUS_CANCELLED


async def test_a_steer_sent_to_one_worker_reaches_a_stream_running_in_the_other(
    gateway: Workers, fake: RoutedFake
) -> None:
    other, runs_in = gateway.instances()
    stream = Stream(gateway_view(gateway, runs_in), user("hold on"))
    await stream.wait_for_deltas(1)
    await fake.wait_held(10)
    assert await instance_of(gateway.url, stream.response_id) == runs_in
    part = pb.ContentPart(input_text=pb.InputText(text="use the EU region"))
    steer = pb.Control(
        steer=pb.SteerControl(items=[pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[part]))])
    )
    reply = await gateway.stub(other).ControlResponse(
        pb.ControlResponseRequest(response_id=stream.response_id, control=steer)
    )
    assert reply.response.id == stream.response_id
    fake.release()
    events = await stream.finished()
    assert_valid_stream(events)
    assert "input_injected" in kinds(events)
    assert output_text(response_of(events[-1])).endswith("answer to use the EU region")


async def test_an_attach_to_one_worker_reads_a_background_run_of_the_other_to_its_end(gateway: Workers) -> None:
    runs_in, other = gateway.instances()
    request = user("slow in background")
    request.background = True
    created = [m async for m in gateway.stub(runs_in).CreateResponse(request)]
    response_id = response_of(created[0].event).id
    assert await instance_of(gateway.url, response_id) == runs_in

    events: list[pb.StreamEvent] = []
    attach = gateway.stub(other).AttachResponse(pb.AttachResponseRequest(response_id=response_id, starting_after=0))
    async with asyncio.timeout(60):
        async for message in attach:
            events += events_of(message)
            if len(events) == 5:
                # Cut it short, through the attaching worker: the attach ends with the terminal event.
                await gateway.stub(other).CancelResponse(pb.CancelResponseRequest(response_id=response_id))
    assert_valid_stream(events)
    assert kind(events[-1]) == "cancelled"


async def test_the_parents_metrics_port_serves_every_workers_metrics_labelled(gateway: Workers) -> None:
    metrics = f"http://127.0.0.1:{gateway.metrics_port}/metrics"
    async with aiohttp.ClientSession() as session, session.get(metrics) as reply:
        assert reply.status == 200
        text = await reply.text()
    for index in ("0", "1"):
        assert f'antwort_worker_up{{worker="{index}"}} 1.0' in text, text[:2000]
        assert re.search(rf'grpc_server_started_total{{[^}}]*worker="{index}"', text), text[:2000]
    assert re.search(r'process_resident_memory_bytes{worker="1"}', text)
    check = promtool_check_metrics(text)
    assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr


# -- shutdown: each test its own gateway ----------------------------------------------------------


def gone(pid: int) -> bool:
    """Ended (or a zombie nobody reaped yet: it serves nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


async def until(check: Callable[[], bool], timeout: float = 30) -> None:
    """Polls: a process's end or a line of another process's output has no event to wait on."""
    for _ in range(int(timeout / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"not within {timeout} s")


@pytest.mark.parametrize(
    ("sig", "env"),
    [
        (signal.SIGTERM, {"ANTWORT_SHUTDOWN_DRAIN": "0.5", "ANTWORT_SHUTDOWN_GRACE": "2"}),
        # As a terminal sends Ctrl-C: to the parent's process group. Its workers, in groups of their
        # own, hear it once, from the parent (twice would end them at once, without terminal events).
        (signal.SIGINT, {"ANTWORT_SHUTDOWN_GRACE": "60", "ANTWORT_INTERRUPT_GRACE": "1"}),
    ],
    ids=["sigterm", "ctrl_c"],
)
async def test_one_signal_to_the_parent_drains_every_worker_and_each_stream_gets_its_terminal_event(
    postgres_admin_url: str, fake: RoutedFake, sig: signal.Signals, env: dict[str, str]
) -> None:
    async with empty_database(postgres_admin_url) as url, workers_process(url, fake.url, **env) as gateway:
        await one_channel_per_worker(gateway, 2)
        streams = [Stream(gateway_view(gateway, i), user(f"slow {n}")) for i in gateway.instances() for n in range(4)]
        for stream in streams:
            await stream.wait_for_deltas(2)
        ran_in = {await instance_of(url, s.response_id) for s in streams}
        assert ran_in == set(gateway.instances())

        os.killpg(gateway.process.pid, sig)
        async with asyncio.timeout(40):
            results = [await stream.finished() for stream in streams]
            exit_code = await gateway.process.wait()
        await until(lambda: all(gone(pid) for pid in gateway.pids))

        assert exit_code == 0, "".join(gateway.output)
        for events in results:
            assert_valid_stream(events)
            assert kind(events[-1]) == "cancelled"
        conn = await asyncpg.connect(url)
        try:
            ids = [s.response_id for s in streams]
            rows = await conn.fetch("SELECT status FROM antwort_responses WHERE id = ANY($1)", ids)
        finally:
            await conn.close()
        assert [r["status"] for r in rows] == [S.RESPONSE_STATUS_CANCELLED] * len(streams)
        assert "Traceback" not in "".join(gateway.output), "".join(gateway.output)


async def test_workers_whose_parent_is_killed_shut_down_on_their_own(postgres_admin_url: str, fake: RoutedFake) -> None:
    async with empty_database(postgres_admin_url) as url, workers_process(url, fake.url) as gateway:
        assert all(not gone(pid) for pid in gateway.pids)
        gateway.process.kill()
        await gateway.process.wait()
        await until(lambda: all(gone(pid) for pid in gateway.pids))


async def test_a_worker_that_dies_is_started_again_and_the_port_serves_on(
    postgres_admin_url: str, fake: RoutedFake
) -> None:
    async with empty_database(postgres_admin_url) as url, workers_process(url, fake.url) as gateway:
        first = gateway.pids[0]
        index = next(found.group(1) for found in map(WORKER_LINE.search, gateway.output) if found)
        os.kill(first, signal.SIGKILL)
        await until(lambda: sum(f"worker {index} serving" in line for line in gateway.output) == 2)
        assert gone(first) and any(f"worker {index} (pid {first}) exited with code -9" in x for x in gateway.output)
        await one_channel_per_worker(gateway, 2)


def children_of(pid: int) -> list[tuple[int, str]]:
    """The processes whose parent is `pid`, with their command lines."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append((int(entry.name), cmdline))
    return found


@pytest.mark.skipif(not local_model.available(), reason="the embedded local model is not installed")
async def test_the_embedded_model_is_started_once_by_the_parent_and_every_worker_uses_it(
    postgres_admin_url: str,
) -> None:
    async with empty_database(postgres_admin_url) as url, workers_process(url, backend="") as gateway:
        models = [c for c in children_of(gateway.process.pid) if "antwort_grpc.providers.local_model" in c[1]]
        assert len(models) == 1, children_of(gateway.process.pid)
        assert sorted(p for p, c in children_of(gateway.process.pid) if "workers.child" in c) == sorted(gateway.pids)
        for worker in gateway.pids:
            assert children_of(worker) == [], "a worker starts no model of its own"
        await one_channel_per_worker(gateway, 2)
        for instance in gateway.instances():
            request = user("Say hi")
            request.max_output_tokens = 4
            reply = [m async for m in gateway.stub(instance).CreateResponse(request)]
            answered = response_of(reply[-1].event)
            assert answered.model == local_model.MODEL_NAME and output_text(answered), answered
            assert answered.status == S.RESPONSE_STATUS_INCOMPLETE  # at its max_output_tokens
