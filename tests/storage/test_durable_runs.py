"""Background runs that outlive their connection and their replica: real `antwort-grpc serve`
processes on PostgreSQL (replicas) and SQLite (one node), a fake OpenAI-compatible backend that
answers by the conversation it is sent, and a real tool executor service in this process."""

from __future__ import annotations

import asyncio
import contextvars
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import web

from antwort_grpc import pb
from antwort_grpc.executors.base import ProgressSink
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply, ScriptedToolCall
from antwort_grpc.tool_services.sdk import ExecutorService, function_tool, serve_executor, text_result
from tests.harness import assert_valid_reattachment, assert_valid_stream, events_of, kinds, response_of, user
from tests.harness import function_tool as request_tool
from tests.storage.conftest import empty_database
from tests.storage.processes import GatewayProcess, gateway_process, get
from tests.test_auth import reason_of

S = pb.ResponseStatus
RUNNING = (S.RESPONSE_STATUS_QUEUED, S.RESPONSE_STATUS_IN_PROGRESS)
# A lease of a second: takeover within a second or two of a kill.
FAST = {"ANTWORT_BACKGROUND_LEASE_SECONDS": "1", "ANTWORT_STORE_MAINTENANCE_SECONDS": "0.2"}

_body: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("body")


class RoutedFake(FakeOpenAI):
    """The fake backend, answering each request by what `route` makes of its body."""

    def __init__(self, route: Callable[[dict[str, Any]], Reply]) -> None:
        super().__init__()
        self.route = route

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        _body.set(await request.json())
        return await super()._chat(request)

    def _take(self) -> Reply | None:
        return self.route(_body.get())


def output_text_of(item: pb.Item) -> str:
    return "".join(part.output_text.text for part in item.message.content)


def first_text(body: dict[str, Any]) -> str:
    return str(body["messages"][0]["content"])


def tool_answers(body: dict[str, Any]) -> list[str]:
    return [str(m.get("content")) for m in body["messages"] if m["role"] == "tool"]


@dataclass
class Tools(ExecutorService):
    """`charge` (not idempotent) and `lookup` (idempotent): each counts its calls and, until
    `free` is set, waits inside the call."""

    name: str = "payments"
    calls: dict[str, int] = field(default_factory=lambda: {"charge": 0, "lookup": 0})
    started: asyncio.Event = field(default_factory=asyncio.Event)
    free: asyncio.Event = field(default_factory=asyncio.Event)

    async def list_tools(self) -> list[pb.ExecutorTool]:
        schema = {"type": "object", "properties": {}}
        return [
            function_tool("charge", "Charge the card", schema),
            function_tool("lookup", "Look the order up", schema, idempotent=True),
        ]

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: ProgressSink) -> pb.FunctionCallOutput:
        self.calls[call.name] += 1
        if sum(self.calls.values()) >= 2:
            self.started.set()
        await self.free.wait()
        return text_result(f"{call.name} done")


class Holding:
    """How many plain runs' model streams are held mid-turn."""

    def __init__(self) -> None:
        self.count = 0
        self.changed = asyncio.Event()

    async def reach(self, count: int) -> None:
        async with asyncio.timeout(20):
            while self.count < count:
                self.changed.clear()
                await self.changed.wait()


def route_while(killed: asyncio.Event, holding: Holding) -> Callable[[dict[str, Any]], Reply]:
    """Plain runs stream slowly (and hold) until the kill, then answer at once; tool runs call
    their tool first, then answer what the tool said."""

    def route(body: dict[str, Any]) -> Reply:
        text = first_text(body)
        if text.startswith("tool:"):
            answers = tool_answers(body)
            if not answers:
                name = text.removeprefix("tool:")
                return Reply(tool_calls=[ScriptedToolCall(name=name, arguments="{}", id=f"call_{name}")])
            return Reply(text=f"the tool said: {answers[0]}")
        if not killed.is_set():
            holding.count += 1
            holding.changed.set()
            return Reply(text="slow " * 50, hold_at=3)
        return Reply(text=f"answer to {text}")

    return route


async def poll_ended(gateway: GatewayProcess, response_id: str, timeout: float = 30) -> pb.Response:
    async with asyncio.timeout(timeout):
        while True:
            response = await get(gateway, response_id)
            if response.status not in RUNNING:
                return response
            await asyncio.sleep(0.05)


def background(text: str, *tools: str) -> pb.CreateResponseRequest:
    request = user(text)
    request.background = True
    for name in tools:
        request.tools.append(request_tool(name))
    return request


async def start_background(gateway: GatewayProcess, request: pb.CreateResponseRequest) -> str:
    messages = [m async for m in gateway.stub.CreateResponse(request)]
    assert kinds([m.event for m in messages]) == ["created"]
    return response_of(messages[0].event).id


class Attached:
    """AttachResponse read in the background."""

    def __init__(self, gateway: GatewayProcess, response_id: str, after: int = 0, *, batched: bool = False) -> None:
        request = pb.AttachResponseRequest(response_id=response_id, starting_after=after, batch_events=batched)
        self.call = gateway.stub.AttachResponse(request)
        self.events: list[pb.StreamEvent] = []
        self.messages = 0
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.call:
            self.messages += 1
            self.events += events_of(message)

    async def finished(self, timeout: float = 30) -> list[pb.StreamEvent]:
        async with asyncio.timeout(timeout):
            await self.task
        return self.events


@asynccontextmanager
async def executor(tools: Tools) -> AsyncIterator[str]:
    served = await serve_executor(tools)
    try:
        yield served.target
    finally:
        tools.free.set()
        await served.stop(0)


Route = Callable[[dict[str, Any]], Reply]


def route_held(killed: asyncio.Event, holding: Holding, resumed_hold: asyncio.Event) -> Route:
    """Every model call counts in `holding`; the first runs hold until the kill, the resumed ones
    while `resumed_hold` is set."""

    def route(body: dict[str, Any]) -> Reply:
        holding.count += 1
        holding.changed.set()
        if not killed.is_set():
            return Reply(text="slow " * 50, hold_at=3)
        return Reply(text=f"answer to {first_text(body)}", hold_at=2 if resumed_hold.is_set() else None)

    return route


# -- PostgreSQL replicas -----------------------------------------------------------------------------


@pytest.mark.parametrize("batched", [False, True], ids=["one_event_each", "batched"])
async def test_a_stream_dropped_on_one_replica_is_read_on_from_the_other_exactly_once(
    postgres_admin_url: str, batched: bool
) -> None:
    route = lambda body: Reply(text="word " * 40, delay=0.01)  # noqa: E731
    async with AsyncExitStack() as stack:
        url = await stack.enter_async_context(empty_database(postgres_admin_url))
        fake = await stack.enter_async_context(RoutedFake(route))
        a = await stack.enter_async_context(gateway_process(url, fake.url, **FAST))
        b = await stack.enter_async_context(gateway_process(url, fake.url, **FAST))
        request = background("talk")
        request.stream = True
        call = a.stub.CreateResponse(request)
        seen: list[pb.StreamEvent] = []
        async for message in call:
            seen.append(message.event)
            if len(seen) == 12:
                break
        call.cancel()
        response_id = response_of(seen[0]).id
        attached = Attached(b, response_id, after=12, batched=batched)
        rest = await attached.finished()
        assert_valid_reattachment(seen, 12, rest)
        assert response_of(rest[-1]).status == S.RESPONSE_STATUS_COMPLETED
        assert len(fake.chat_requests) == 1
        if batched:
            assert attached.messages < len(rest), "events read from the log together leave together"


async def test_a_create_retried_on_the_other_replica_with_its_idempotency_key_is_one_response(
    postgres_admin_url: str,
) -> None:
    route = lambda body: Reply(text="charged once", delay=0.05)  # noqa: E731
    async with AsyncExitStack() as stack:
        url = await stack.enter_async_context(empty_database(postgres_admin_url))
        fake = await stack.enter_async_context(RoutedFake(route))
        a = await stack.enter_async_context(gateway_process(url, fake.url, **FAST))
        b = await stack.enter_async_context(gateway_process(url, fake.url, **FAST))
        key = (("idempotency-key", "invoice-42"),)
        request = background("charge invoice 42")
        first = [m async for m in a.stub.CreateResponse(request, metadata=key)]
        retried = [m async for m in b.stub.CreateResponse(request, metadata=key)]
        response_id = response_of(first[0].event).id
        assert response_of(retried[0].event).id == response_id
        assert (await poll_ended(b, response_id)).status == S.RESPONSE_STATUS_COMPLETED
        assert len(fake.chat_requests) == 1
        other = background("charge invoice 43")
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            [m async for m in b.stub.CreateResponse(other, metadata=key)]
        assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_kill_9_of_the_replica_running_20_background_runs_leaves_them_all_completed_on_the_survivor(
    postgres_admin_url: str,
) -> None:
    killed, holding = asyncio.Event(), Holding()
    tools = Tools()
    async with AsyncExitStack() as stack:
        url = await stack.enter_async_context(empty_database(postgres_admin_url))
        fake = await stack.enter_async_context(RoutedFake(route_while(killed, holding)))
        target = await stack.enter_async_context(executor(tools))
        env = {**FAST, "ANTWORT_EXECUTORS": target}
        a = await stack.enter_async_context(gateway_process(url, fake.url, **env))
        b = await stack.enter_async_context(gateway_process(url, fake.url, **env))
        ids = [await start_background(a, background(f"plain {n}")) for n in range(18)]
        ids.append(await start_background(a, background("tool:charge", "charge", "lookup")))
        ids.append(await start_background(a, background("tool:lookup", "charge", "lookup")))
        attached = [Attached(b, response_id) for response_id in ids]
        # A client of the replica that dies: it re-attaches to the survivor after what it read.
        # (It drops the stream itself before the kill: with a call cut by the kill, this process
        # later failed in CPython 3.11's ast.parse, "AST constructor recursion depth mismatch". A
        # CPython bug before 3.11.8 (gh-106905): 3.11 may collect garbage while ast.parse builds
        # its tree, and a finalizer that formats a traceback (3.11's traceback module parses the
        # line for its carets) calls ast.parse again, which resets the depth counter the outer
        # call shares. The cut call's leftovers were such garbage. 3.11.8+ and 3.12 do not fail.)
        on_a = Attached(a, ids[1])
        async with asyncio.timeout(20):
            await tools.started.wait()
        await holding.reach(18)
        # Held streams have sent their first deltas: the log has items the resumed runs supersede.
        await asyncio.sleep(0.3)
        # It drops its stream (a read cut by the replica's death is the same to the log).
        on_a.call.cancel()
        await asyncio.wait([on_a.task], timeout=20)
        read = list(on_a.events)
        assert read, "the client of the lost replica had read events"
        a.kill()
        killed.set()
        tools.free.set()
        rest = await Attached(b, ids[1], after=read[-1].sequence_number).finished()
        assert_valid_reattachment(read, read[-1].sequence_number, rest)
        assert "recovered" in kinds(rest)
        ended = [await poll_ended(b, response_id) for response_id in ids]
        assert [r.status for r in ended] == [S.RESPONSE_STATUS_COMPLETED] * 20
        streams = [await reader.finished() for reader in attached]
        for events in streams:
            assert_valid_stream(events)
            assert "recovered" in kinds(events)
        # The call that is not idempotent ran once (the model was told it was interrupted); the
        # idempotent one ran again on the survivor.
        assert tools.calls == {"charge": 1, "lookup": 2}
        charged = ended[18]
        outputs = [i.function_call_output for i in charged.output if i.WhichOneof("kind") == "function_call_output"]
        assert len(outputs) == 1 and outputs[0].is_error and "interrupted" in outputs[0].output
        recovered = next(e for e in streams[0] if kinds([e]) == ["recovered"]).recovered
        assert recovered.reason == "replica_lost" and recovered.from_turn == 0
        # What the lost replica had begun stays, incomplete; the model's answer made again follows.
        superseded, answer = ended[0].output
        assert superseded.status == pb.ItemStatus.ITEM_STATUS_INCOMPLETE
        # It keeps the text the lost replica had logged (the stream validator checked its deltas).
        assert output_text_of(superseded).startswith("slow slow")
        assert output_text_of(answer) == "answer to plain 0"
        # The turn the replica died in was closed by the survivor, naming why; the tool runs'
        # executions it had begun ended (the idempotent one then ran again, paired).
        closed = [e.turn_completed for e in streams[0] if kinds([e]) == ["turn_completed"]]
        assert [(t.turn, t.interrupted) for t in closed] == [(1, "replica_lost"), (2, "")]
        charge_events = [kinds([e])[0] for e in streams[18] if kinds([e])[0].startswith("tool_execution")]
        assert charge_events == ["tool_execution_in_progress", "tool_execution_failed"]
        lookup_events = [kinds([e])[0] for e in streams[19] if kinds([e])[0].startswith("tool_execution")]
        interrupted_then_rerun = ["in_progress", "failed", "in_progress", "completed"]
        assert lookup_events == [f"tool_execution_{k}" for k in interrupted_then_rerun]


def route_approved_pair(body: dict[str, Any]) -> Reply:
    """Both tools at once, first; once their outputs are in, the answer naming them."""
    answers = tool_answers(body)
    if not answers:
        calls = [ScriptedToolCall(name=n, arguments="{}", id=f"call_{n}") for n in ("charge", "lookup")]
        return Reply(tool_calls=calls)
    return Reply(text="after: " + " | ".join(answers))


async def test_a_background_continuation_whose_replica_dies_while_its_tools_run_completes_on_the_other(
    postgres_admin_url: str,
) -> None:
    tools = Tools()
    async with AsyncExitStack() as stack:
        url = await stack.enter_async_context(empty_database(postgres_admin_url))
        fake = await stack.enter_async_context(RoutedFake(route_approved_pair))
        target = await stack.enter_async_context(executor(tools))
        env = {**FAST, "ANTWORT_EXECUTORS": target}
        a = await stack.enter_async_context(gateway_process(url, fake.url, **env))
        b = await stack.enter_async_context(gateway_process(url, fake.url, **env))
        # The earlier response: both calls wait for approval (nobody attached to decide).
        first = user("pay and look it up")
        for name in ("charge", "lookup"):
            tool = request_tool(name)
            tool.require_approval.mode = pb.ApprovalMode.APPROVAL_MODE_ALWAYS
            first.tools.append(tool)
        asked = [m async for m in a.stub.CreateResponse(first)][-1].event.requires_action.response
        assert asked.status == S.RESPONSE_STATUS_REQUIRES_ACTION
        # Continued in background with both approved: its calls run first, on a.
        request = pb.CreateResponseRequest(previous_response_id=asked.id, background=True)
        request.tools.extend(first.tools)
        for name in ("charge", "lookup"):
            decision = pb.ApprovalResponse(call_id=f"call_{name}", approve=True)
            request.input_items.items.append(pb.Item(approval_response=decision))
        response_id = await start_background(a, request)
        reader = Attached(b, response_id)
        async with asyncio.timeout(20):
            await tools.started.wait()
        a.kill()
        tools.free.set()
        done = await poll_ended(b, response_id)
        events = await reader.finished()
    assert done.status == S.RESPONSE_STATUS_COMPLETED
    assert_valid_stream(events)
    assert "recovered" in kinds(events)
    # The idempotent call ran again on the survivor; the other was not, and the model was told.
    assert tools.calls == {"charge": 1, "lookup": 2}
    outputs = {
        i.function_call_output.call_id: i.function_call_output
        for i in done.output
        if i.WhichOneof("kind") == "function_call_output"
    }
    assert set(outputs) == {"call_charge", "call_lookup"}
    assert outputs["call_charge"].is_error and "interrupted" in outputs["call_charge"].output
    assert not outputs["call_lookup"].is_error
    assert output_text_of(done.output[-1]).startswith("after: ")


async def test_a_rolling_restart_under_50_background_runs_completes_all_50(postgres_admin_url: str) -> None:
    # Each run takes about 3 s, longer than the shutdown grace.
    route = lambda body: Reply(text="step " * 60, delay=0.05)  # noqa: E731
    async with AsyncExitStack() as stack:
        url = await stack.enter_async_context(empty_database(postgres_admin_url))
        fake = await stack.enter_async_context(RoutedFake(route))
        # Long leases: only the handover on SIGTERM can move the runs in time.
        env = {"ANTWORT_BACKGROUND_LEASE_SECONDS": "60", "ANTWORT_SHUTDOWN_GRACE": "0.5"}
        a_manager = gateway_process(url, fake.url, **env)
        a = await a_manager.__aenter__()
        b = await stack.enter_async_context(gateway_process(url, fake.url, **env))
        ids = [await start_background(a if n % 2 else b, background(f"run {n}")) for n in range(50)]
        a.process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            await a.process.wait()
        await a_manager.__aexit__(None, None, None)
        c = await stack.enter_async_context(gateway_process(url, fake.url, **env))
        b.process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            await b.process.wait()
        ended = [await poll_ended(c, response_id, timeout=60) for response_id in ids]
        assert sum(r.status == S.RESPONSE_STATUS_COMPLETED for r in ended) == 50
        events = await Attached(c, ids[1]).finished()
        assert_valid_stream(events)


async def test_a_run_handed_over_to_a_replica_at_its_running_cap_waits_there_for_room(
    postgres_admin_url: str,
) -> None:
    stopped, holding, resumed_hold = asyncio.Event(), Holding(), asyncio.Event()
    async with AsyncExitStack() as stack:
        url = await stack.enter_async_context(empty_database(postgres_admin_url))
        fake = await stack.enter_async_context(RoutedFake(route_held(stopped, holding, resumed_hold)))
        env = {**FAST, "ANTWORT_SHUTDOWN_GRACE": "0.5", "ANTWORT_MAX_RUNNING_RESPONSES": "1"}
        a_manager = gateway_process(url, fake.url, **env)
        a = await a_manager.__aenter__()
        b = await stack.enter_async_context(gateway_process(url, fake.url, **env))
        handed = await start_background(a, background("handed"))
        busy = await start_background(b, background("busy"))
        await holding.reach(2)
        # Its first events are in the log, so its resumption says it recovered.
        first_logged = b.stub.AttachResponse(pb.AttachResponseRequest(response_id=handed), timeout=20)
        await first_logged.read()
        first_logged.cancel()
        stopped.set()
        a.process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            await a.process.wait()
        await a_manager.__aexit__(None, None, None)
        # Told of the handover, then a look every quarter lease: b has no room for it.
        await asyncio.sleep(1.5)
        assert holding.count == 2, "the replica at its cap took no run over"
        assert (await get(b, handed)).status in RUNNING
        fake.release()
        assert (await poll_ended(b, busy)).status == S.RESPONSE_STATUS_COMPLETED
        # Room again: b resumes the run it was handed.
        assert (await poll_ended(b, handed)).status == S.RESPONSE_STATUS_COMPLETED
        events = await Attached(b, handed).finished()
        assert_valid_stream(events)
        recovered = next(e.recovered for e in events if kinds([e]) == ["recovered"])
        assert recovered.reason == "handed_over"


# -- SQLite: one node, restarted ---------------------------------------------------------------------


async def test_sqlite_kill_9_and_restart_resumes_the_background_runs(tmp_path: Path) -> None:
    killed, holding = asyncio.Event(), Holding()
    store = f"sqlite:///{tmp_path / 'antwort.db'}"
    async with RoutedFake(route_while(killed, holding)) as fake:
        async with gateway_process(store, fake.url, **FAST) as first:
            ids = [await start_background(first, background(f"plain {n}")) for n in range(3)]
            await holding.reach(3)
            await asyncio.sleep(0.3)
            first.kill()
            await first.process.wait()
        killed.set()
        async with gateway_process(store, fake.url, **FAST) as second:
            ended = [await poll_ended(second, response_id) for response_id in ids]
            assert [r.status for r in ended] == [S.RESPONSE_STATUS_COMPLETED] * 3
            events = await Attached(second, ids[0]).finished()
            assert_valid_stream(events)
            assert "recovered" in kinds(events)
            assert [output_text_of(r.output[-1]) for r in ended] == [f"answer to plain {n}" for n in range(3)]


@pytest.mark.parametrize(
    ("limit", "reason", "resumed_at_once"),
    [
        # At its running cap the restarted gateway resumes one run, the other when room comes back.
        ({"ANTWORT_MAX_RUNNING_RESPONSES": "1"}, "too_many_running", 1),
        # A resumed run was let in where it started: both resume, and both count for the principal.
        ({"ANTWORT_MAX_CONCURRENT_RESPONSES": "1"}, "too_many_responses", 2),
    ],
)
async def test_resumed_background_runs_count_against_the_gateways_admission_until_they_end(
    tmp_path: Path, limit: dict[str, str], reason: str, resumed_at_once: int
) -> None:
    killed, holding, resumed_hold = asyncio.Event(), Holding(), asyncio.Event()
    resumed_hold.set()
    store = f"sqlite:///{tmp_path / 'antwort.db'}"
    async with RoutedFake(route_held(killed, holding, resumed_hold)) as fake:
        async with gateway_process(store, fake.url, **FAST) as first:
            ids = [await start_background(first, background(f"plain {n}")) for n in range(2)]
            await holding.reach(2)
            first.kill()
            await first.process.wait()
        killed.set()
        fake.release()  # the dead gateway's streams
        async with gateway_process(store, fake.url, **FAST, **limit) as second:
            await holding.reach(2 + resumed_at_once)
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await start_background(second, background("meanwhile"))
            assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, raised.value.details()
            assert reason_of(raised.value) == reason
            assert holding.count == 2 + resumed_at_once, "no more runs were resumed than there was room for"
            resumed_hold.clear()
            fake.release()
            ended = [await poll_ended(second, response_id) for response_id in ids]
            assert [r.status for r in ended] == [S.RESPONSE_STATUS_COMPLETED] * 2
            # Both were resumed here (only a model call after the kill answers this way).
            assert [output_text_of(r.output[-1]) for r in ended] == ["answer to plain 0", "answer to plain 1"]
            for response_id in ids:
                assert_valid_stream(await Attached(second, response_id).finished())
            # They gave their room back when they ended.
            after = await start_background(second, background("after"))
            assert (await poll_ended(second, after)).status == S.RESPONSE_STATUS_COMPLETED


async def test_attach_to_another_owners_or_an_unknown_response_is_not_found(tmp_path: Path) -> None:
    async with FakeOpenAI() as fake, gateway_process(f"sqlite:///{tmp_path / 'a.db'}", fake.url) as gateway:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await Attached(gateway, "resp_unknown").finished()
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND
