"""Durability and replicas with real `antwort-grpc serve` processes: killed with SIGKILL in the
middle of a stream, restarted on the same store; two gateways sharing one PostgreSQL. The model
backend is the fake OpenAI-compatible server, streaming slow tokens."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import asyncpg
import grpc
import pytest

from antwort_grpc import pb
from antwort_grpc.storage.base import INTERRUPTED
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply, ScriptedToolCall
from tests.harness import assert_valid_stream, function_tool, kinds, output_text, response_of, user
from tests.storage.processes import GatewayProcess, gateway_process

S = pb.ResponseStatus
SLOW = Reply(text="word " * 400, delay=0.02)


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/gateway.db"
    url: str = request.getfixturevalue("postgres_url")
    return url


class Stream:
    """A streaming CreateResponse read in the background, so the test can act mid-stream."""

    def __init__(self, gateway: GatewayProcess, request: pb.CreateResponseRequest) -> None:
        request.stream = True
        self.call = gateway.stub.CreateResponse(request)
        self.events: list[pb.StreamEvent] = []
        self._deltas = asyncio.Condition()
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.call:
            self.events.append(message.event)
            async with self._deltas:
                self._deltas.notify_all()

    @property
    def response_id(self) -> str:
        return self.events[0].created.response.id

    async def wait_for_deltas(self, count: int) -> None:
        async with asyncio.timeout(20), self._deltas:
            await self._deltas.wait_for(lambda: kinds(self.events).count("output_text_delta") >= count)

    async def finished(self) -> list[pb.StreamEvent]:
        async with asyncio.timeout(20):
            await self.task
        return self.events


async def get(gateway: GatewayProcess, response_id: str) -> pb.Response:
    reply = await gateway.stub.GetResponse(pb.GetResponseRequest(response_id=response_id))
    response: pb.Response = reply.response
    return response


async def create(gateway: GatewayProcess, request: pb.CreateResponseRequest) -> pb.Response:
    request.stream = False
    messages = [m async for m in gateway.stub.CreateResponse(request)]
    assert len(messages) == 1
    return response_of(messages[0].event)


async def replica_gone(url: str, response_id: str) -> None:
    """Wait until the PostgreSQL session of the replica that ran a response has ended: take that
    replica's lock (it is granted once the server has closed the dead process's session)."""
    conn = await asyncpg.connect(url)
    try:
        instance = await conn.fetchval("SELECT instance FROM antwort_responses WHERE id = $1", response_id)
        async with asyncio.timeout(30):
            await conn.execute("SELECT pg_advisory_lock(hashtextextended($1, 0))", instance)
        await conn.execute("SELECT pg_advisory_unlock(hashtextextended($1, 0))", instance)
    finally:
        await conn.close()


async def replicas(stack: AsyncExitStack, count: int, url: str, backend_url: str, **env: str) -> list[GatewayProcess]:
    """Start `count` gateways on one store at the same time (they also migrate at the same time)."""
    managers = [gateway_process(url, backend_url, **env) for _ in range(count)]
    started = await asyncio.gather(*(m.__aenter__() for m in managers))
    for manager in managers:
        stack.push_async_exit(manager.__aexit__)
    return list(started)


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as opened:
        yield opened


async def test_a_gateway_killed_mid_stream_leaves_the_response_failed_interrupted_after_a_restart(
    store_url: str, stack: AsyncExitStack
) -> None:
    fake = await stack.enter_async_context(FakeOpenAI(Reply(text="Done quickly."), SLOW))
    async with gateway_process(store_url, fake.url) as first:
        completed = await create(first, user("quick one"))
        assert completed.status == S.RESPONSE_STATUS_COMPLETED
        stream = Stream(first, user("talk slowly"))
        await stream.wait_for_deltas(3)
        first.kill()
        await first.process.wait()
        with pytest.raises(grpc.aio.AioRpcError):
            await stream.finished()
    response_id = stream.response_id
    if store_url.startswith("postgresql"):
        await replica_gone(store_url, response_id)

    async with gateway_process(store_url, fake.url) as second:
        interrupted = await get(second, response_id)
        assert interrupted.status == S.RESPONSE_STATUS_FAILED
        assert interrupted.error.code == INTERRUPTED
        assert await get(second, completed.id) == completed, "completed responses are intact"
        items = await second.stub.ListInputItems(pb.ListInputItemsRequest(response_id=response_id))
        assert [p.input_text.text for i in items.items for p in i.message.content] == ["talk slowly"]


async def test_requires_action_on_replica_a_is_continued_on_replica_b(postgres_url: str, stack: AsyncExitStack) -> None:
    call = ScriptedToolCall(name="get_weather", arguments='{"city": "Paris"}', id="call_paris")
    fake = await stack.enter_async_context(FakeOpenAI(Reply(tool_calls=[call]), Reply(text="Sunny in Paris.")))
    a, b = await replicas(stack, 2, postgres_url, fake.url)

    request = user("Weather in Paris?")
    request.tools.append(function_tool("get_weather", city="string"))
    paused = await create(a, request)
    assert paused.status == S.RESPONSE_STATUS_REQUIRES_ACTION

    follow = pb.CreateResponseRequest(previous_response_id=paused.id)
    follow.tools.append(function_tool("get_weather", city="string"))
    follow.input_items.items.append(
        pb.Item(function_call_output=pb.FunctionCallOutput(call_id="call_paris", output='{"temp_c": 21}'))
    )
    stream = Stream(b, follow)
    events = await stream.finished()
    assert_valid_stream(events)
    done = response_of(events[-1])
    assert done.status == S.RESPONSE_STATUS_COMPLETED and output_text(done) == "Sunny in Paris."

    messages = fake.chat_requests[1]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["id"] == "call_paris"
    assert messages[2]["tool_call_id"] == "call_paris" and messages[2]["content"] == '{"temp_c": 21}'
    assert (await get(a, done.id)) == done, "replica A reads what replica B stored"
    assert (await get(b, paused.id)) == paused


async def test_cancel_on_replica_b_ends_a_stream_running_on_replica_a(postgres_url: str, stack: AsyncExitStack) -> None:
    fake = await stack.enter_async_context(FakeOpenAI(SLOW))
    a, b = await replicas(stack, 2, postgres_url, fake.url)
    stream = Stream(a, user("talk slowly"))
    await stream.wait_for_deltas(3)

    reply = await b.stub.CancelResponse(pb.CancelResponseRequest(response_id=stream.response_id))
    assert reply.response.status == S.RESPONSE_STATUS_CANCELLED

    events = await stream.finished()
    assert_valid_stream(events)
    assert kinds(events)[-1] == "cancelled"
    await fake.wait_for_disconnect()
    stored = await get(b, stream.response_id)
    assert stored.status == S.RESPONSE_STATUS_CANCELLED
    assert output_text(stored).startswith("word word word")


async def test_a_surviving_replica_marks_a_killed_replicas_response_interrupted(
    postgres_url: str, stack: AsyncExitStack
) -> None:
    fake = await stack.enter_async_context(FakeOpenAI(SLOW))
    a, b = await replicas(stack, 2, postgres_url, fake.url, ANTWORT_STORE_MAINTENANCE_SECONDS="0.1")
    changes = await stack.enter_async_context(status_changes(postgres_url))
    stream = Stream(a, user("talk slowly"))
    await stream.wait_for_deltas(3)
    assert (await get(b, stream.response_id)).status == S.RESPONSE_STATUS_IN_PROGRESS
    a.kill()
    with pytest.raises(grpc.aio.AioRpcError):
        await stream.finished()
    # Nobody restarts anything: B's periodic sweep finds A's session gone.
    async with asyncio.timeout(20):
        while await changes.get() != (stream.response_id, S.RESPONSE_STATUS_FAILED):
            pass
    response = await get(b, stream.response_id)
    assert response.status == S.RESPONSE_STATUS_FAILED and response.error.code == INTERRUPTED


@asynccontextmanager
async def status_changes(url: str) -> AsyncIterator[asyncio.Queue[tuple[str, int]]]:
    """Every status a row of the (migrated) database changes to, as it commits: a trigger that
    exists only in this test's database NOTIFYs them."""
    conn = await asyncpg.connect(url)
    await conn.execute(
        """CREATE FUNCTION test_notify_status() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN PERFORM pg_notify('test_status', NEW.id || ' ' || NEW.status); RETURN NEW; END $$;
           CREATE TRIGGER test_status AFTER UPDATE OF status ON antwort_responses
           FOR EACH ROW EXECUTE FUNCTION test_notify_status();"""
    )
    queue: asyncio.Queue[tuple[str, int]] = asyncio.Queue()

    def heard(_conn: object, _pid: int, _channel: str, payload: object) -> None:
        response_id, status = str(payload).split()
        queue.put_nowait((response_id, int(status)))

    await conn.add_listener("test_status", heard)
    try:
        yield queue
    finally:
        await conn.close()
