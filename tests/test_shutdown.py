"""Shutting `antwort-grpc serve` down with streams open, as Kubernetes does (SIGTERM) and as a
person does (Ctrl-C): every client gets its terminal event and every response is stored."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc

from antwort_grpc import pb
from antwort_grpc.storage.sqlite import SQLiteStore
from tests.harness import assert_valid_stream, kind

ANTWORT = str(Path(sys.executable).parent / "antwort-grpc")
S = pb.ResponseStatus
# 400 words, one every 0.1 s: a stream of 40 s, far longer than any grace below.
SLOW_SCRIPT = {"turns": [{"outputs": [{"text": " ".join(["word"] * 400)}], "delay": 0.1}], "repeat": True}


@dataclass
class Gateway:
    process: asyncio.subprocess.Process
    target: str
    db: Path
    output: list[str] = field(default_factory=list)
    said: asyncio.Event = field(default_factory=asyncio.Event)
    expect: str = ""

    async def read_output(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            line = raw.decode(errors="replace")
            self.output.append(line)
            if self.expect and self.expect in line:
                self.said.set()


@asynccontextmanager
async def slow_gateway(tmp_path: Path, **env: str) -> AsyncIterator[Gateway]:
    script = tmp_path / "slow.json"
    script.write_text(json.dumps(SLOW_SCRIPT))
    db = tmp_path / "responses.db"
    process = await asyncio.create_subprocess_exec(
        ANTWORT, "serve", "--listen", "127.0.0.1:0", "--store", f"sqlite:///{db}",
        "--script", str(script), "--model", "scripted",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, **env},
    )  # fmt: skip
    assert process.stdout is not None
    target = ""
    early: list[str] = []
    async with asyncio.timeout(30):
        while not target:
            line = (await process.stdout.readline()).decode()
            assert line, "serve exited before it was ready"
            early.append(line)
            if "serving on" in line:
                target = line.rsplit(" ", 1)[1].strip()
    gateway = Gateway(process, target, db, early)
    reader = asyncio.create_task(gateway.read_output())
    try:
        yield gateway
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        reader.cancel()


@dataclass
class OpenStream:
    events: list[pb.StreamEvent]
    rest: asyncio.Task[str]

    @property
    def response_id(self) -> str:
        return self.events[0].created.response.id


async def open_streams(stub: pb.ResponsesServiceStub, count: int) -> list[OpenStream]:
    """`count` streams, each past its first text delta (so each is mid-answer)."""

    async def one() -> OpenStream:
        events: list[pb.StreamEvent] = []
        messages = aiter(stub.CreateResponse(pb.CreateResponseRequest(input_text="talk", stream=True)))
        while kind(events[-1] if events else pb.StreamEvent()) != "output_text_delta":
            events.append((await anext(messages)).event)

        async def rest() -> str:
            """The rest of the stream; the status code it ended with."""
            try:
                async for message in messages:
                    events.append(message.event)
            except grpc.aio.AioRpcError as err:
                return err.code().name
            return "OK"

        return OpenStream(events, asyncio.create_task(rest()))

    async with asyncio.timeout(60):
        return list(await asyncio.gather(*(one() for _ in range(count))))


async def stored_statuses(db: Path, ids: list[str]) -> list[int]:
    store = await SQLiteStore.open(db)
    try:
        records = [await store.get(i) for i in ids]
    finally:
        await store.close()
    return [r.response.status if r is not None else -1 for r in records]


async def test_sigterm_with_streams_longer_than_drain_and_grace_ends_each_with_cancelled(tmp_path: Path) -> None:
    env = {"ANTWORT_SHUTDOWN_DRAIN": "0.5", "ANTWORT_SHUTDOWN_GRACE": "2"}
    async with slow_gateway(tmp_path, **env) as gateway, grpc.aio.insecure_channel(gateway.target) as channel:
        streams = await open_streams(pb.ResponsesServiceStub(channel), 30)
        gateway.process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            codes = [await s.rest for s in streams]
            exit_code = await gateway.process.wait()
    assert codes == ["OK"] * 30, "".join(gateway.output)
    for stream in streams:
        assert_valid_stream(stream.events)
        assert kind(stream.events[-1]) == "cancelled"
    assert exit_code == 0, "".join(gateway.output)
    ids = [s.response_id for s in streams]
    assert await stored_statuses(gateway.db, ids) == [S.RESPONSE_STATUS_CANCELLED] * 30


async def test_ctrl_c_cancels_in_flight_responses_after_a_short_grace(tmp_path: Path) -> None:
    # The Kubernetes drain and grace are long; Ctrl-C uses neither.
    env = {"ANTWORT_SHUTDOWN_DRAIN": "30", "ANTWORT_SHUTDOWN_GRACE": "60", "ANTWORT_INTERRUPT_GRACE": "1"}
    async with slow_gateway(tmp_path, **env) as gateway, grpc.aio.insecure_channel(gateway.target) as channel:
        streams = await open_streams(pb.ResponsesServiceStub(channel), 10)
        gateway.process.send_signal(signal.SIGINT)
        async with asyncio.timeout(20):
            codes = [await s.rest for s in streams]
            exit_code = await gateway.process.wait()
    assert codes == ["OK"] * 10, "".join(gateway.output)
    assert [kind(s.events[-1]) for s in streams] == ["cancelled"] * 10
    for stream in streams:
        assert_valid_stream(stream.events)
    assert exit_code == 0, "".join(gateway.output)
    assert await stored_statuses(gateway.db, [s.response_id for s in streams]) == [S.RESPONSE_STATUS_CANCELLED] * 10


async def test_a_second_ctrl_c_exits_at_once(tmp_path: Path) -> None:
    async with slow_gateway(tmp_path, ANTWORT_INTERRUPT_GRACE="60") as gateway:
        gateway.expect = "Ctrl-C again"
        async with grpc.aio.insecure_channel(gateway.target) as channel:
            streams = await open_streams(pb.ResponsesServiceStub(channel), 3)
            gateway.process.send_signal(signal.SIGINT)
            async with asyncio.timeout(20):
                await gateway.said.wait()
                gateway.process.send_signal(signal.SIGINT)
                exit_code = await gateway.process.wait()
                codes = [await s.rest for s in streams]
    assert exit_code == -signal.SIGINT, "".join(gateway.output)
    assert "Traceback" not in "".join(gateway.output)
    assert codes == ["UNAVAILABLE"] * 3


async def _grpc_create_taken(stub: pb.ResponsesServiceStub) -> bool:
    """Whether the gRPC door starts a new response now (its `created` event comes)."""
    call = stub.CreateResponse(pb.CreateResponseRequest(input_text="more", stream=True))
    try:
        message = await call.read()
        return kind(message.event) == "created"
    except grpc.aio.AioRpcError as err:
        # UNAVAILABLE: refused by the stopping server. CANCELLED: the call reached grpc's queue just
        # before the server stopped, and grpc ends what it never handed over (no event either way).
        assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), err
        return False
    finally:
        call.cancel()


async def _http_create_taken(session: aiohttp.ClientSession, url: str) -> bool:
    """Whether the HTTP door starts a new response now (200 and a stream), or refuses it (503 with
    Retry-After)."""
    body = {"model": "scripted", "input": "more", "stream": True}
    try:
        async with session.post(url + "/v1/responses", json=body) as reply:
            if reply.status == 503:
                assert reply.headers.get("Retry-After"), reply.headers
                return False
            assert reply.status == 200, await reply.text()
            return True
    except aiohttp.ClientConnectionError:
        return False


async def test_after_the_drain_both_doors_refuse_new_work_from_the_same_moment(tmp_path: Path) -> None:
    """SIGTERM while a long stream drains: during the drain both doors still take creates (health
    says NOT_SERVING); from the moment either refuses one, both refuse every one, and nothing is
    accepted after."""
    env = {"ANTWORT_SHUTDOWN_DRAIN": "1", "ANTWORT_SHUTDOWN_GRACE": "8", "ANTWORT_HTTP_LISTEN": "127.0.0.1:0"}
    async with slow_gateway(tmp_path, **env) as gateway, grpc.aio.insecure_channel(gateway.target) as channel:
        url = next(line.rsplit(" ", 1)[1].strip() for line in gateway.output if "HTTP door listening on" in line)
        stub = pb.ResponsesServiceStub(channel)
        streams = await open_streams(stub, 1)
        gateway.process.send_signal(signal.SIGTERM)
        seen: list[tuple[str, bool]] = []
        async with aiohttp.ClientSession() as session, asyncio.timeout(30):
            while sum(1 for _, taken in seen if not taken) < 6:
                seen.append(("grpc", await _grpc_create_taken(stub)))
                seen.append(("http", await _http_create_taken(session, url)))
            codes = [await s.rest for s in streams]
            await gateway.process.wait()
    first_refusal = next(n for n, (_, taken) in enumerate(seen) if not taken)
    assert first_refusal > 0, "refused before the drain ended"
    assert all(not taken for _, taken in seen[first_refusal:]), seen
    assert {door for door, _ in seen[first_refusal:]} == {"grpc", "http"}
    assert codes == ["OK"]
    assert kind(streams[0].events[-1]) == "cancelled"
