"""Batched events (CreateResponseRequest.batch_events): the events the gateway produces at the same
moment leave in one message. The stream validator sees the same events, in the same order, with
the same sequence numbers either way; a client that does not ask gets one event per message."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from antwort_grpc import pb
from antwort_grpc.engine import Engine, EngineConfig
from antwort_grpc.executors.base import FunctionExecutor
from antwort_grpc.front.batching import batches, parted
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text
from antwort_grpc.providers.scripted import Turn as ScriptedTurn
from antwort_grpc.responses.service import Responses
from antwort_grpc.server.decode import RawRequest
from antwort_grpc.server.servicer import ResponsesServicer
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply, ScriptedToolCall
from tests.fakes import front_of, raw_converse
from tests.harness import assert_valid_stream, events_of, function_tool, kinds, running_gateway, user

ROOT = Path(__file__).resolve().parent.parent
S = pb.ResponseStatus


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as backend:
        yield backend


@pytest.fixture
async def provider(fake: FakeOpenAI) -> AsyncIterator[OpenAICompatProvider]:
    provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model="fake-model"))
    yield provider
    await provider.aclose()


async def messages(stub: Any, request: pb.CreateResponseRequest, batched: bool) -> list[list[pb.StreamEvent]]:
    """The events of one streamed response, message by message."""
    request = pb.CreateResponseRequest.FromString(request.SerializeToString())
    request.stream, request.batch_events = True, batched
    return [events_of(message) async for message in stub.CreateResponse(request)]


def flat(sent: list[list[pb.StreamEvent]]) -> list[pb.StreamEvent]:
    return [event for message in sent for event in message]


def sequence(events: list[pb.StreamEvent]) -> list[tuple[int, str]]:
    return [(event.sequence_number, kind) for event, kind in zip(events, kinds(events), strict=True)]


SCENARIOS: dict[str, tuple[Callable[[], list[Reply]], Callable[[], pb.CreateResponseRequest]]] = {
    "an answer": (lambda: [Reply(text="Bonjour, le monde.")], lambda: user("Say hello in French.")),
    "a server-side tool round": (
        lambda: [
            Reply(text="Let me check.", tool_calls=[ScriptedToolCall(name="echo", arguments='{"x": 1}')]),
            Reply(text="It is one."),
        ],
        lambda: pb.CreateResponseRequest(input_text="Echo one.", tools=[function_tool("echo", x="integer")]),
    ),
    "a client tool handed out": (
        lambda: [Reply(tool_calls=[ScriptedToolCall(name="get_weather", arguments='{"city": "Paris"}')])],
        lambda: pb.CreateResponseRequest(input_text="Weather?", tools=[function_tool("get_weather", city="string")]),
    ),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_a_batched_stream_carries_the_same_events_in_the_same_order_in_fewer_messages(
    scenario: str, fake: FakeOpenAI, provider: OpenAICompatProvider
) -> None:
    replies, request = SCENARIOS[scenario]
    echo = _EchoExecutor()
    async with running_gateway(provider=provider, executors=[echo]) as gw:
        fake.add(*replies())
        one_each = await messages(gw.stub, request(), batched=False)
        fake.add(*replies())
        batched = await messages(gw.stub, request(), batched=True)
    assert all(len(message) == 1 for message in one_each)
    assert_valid_stream(flat(one_each))
    assert_valid_stream(flat(batched))
    assert sequence(flat(batched)) == sequence(flat(one_each))
    assert len(batched) < len(one_each)


async def test_events_produced_together_leave_together(fake: FakeOpenAI, provider: OpenAICompatProvider) -> None:
    # The model's answer waits at its second word: what comes before and after leaves in batches.
    fake.add(Reply(text=["Hello ", "world."], hold_at=2))
    async with running_gateway(provider=provider) as gw:
        request = user("Hi")
        request.stream, request.batch_events = True, True
        call = gw.stub.CreateResponse(request)
        sent = [events_of(await call.read())]
        await fake.wait_held()
        sent.append(events_of(await call.read()))
        fake.release()
        while (message := await call.read()) != grpc.aio.EOF:
            sent.append(events_of(message))
    assert kinds(sent[0]) == ["created", "in_progress", "turn_started"]
    assert kinds(sent[1]) == ["output_item_added", "content_part_added", "output_text_delta"]
    assert kinds(sent[-1])[-6:] == [
        "output_text_done",
        "content_part_done",
        "output_item_done",
        "turn_decided",
        "turn_completed",
        "completed",
    ]
    assert_valid_stream(flat(sent))


async def test_a_batched_message_stays_small_enough_for_a_client_with_grpc_default_limits(
    fake: FakeOpenAI, provider: OpenAICompatProvider
) -> None:
    # created and in_progress each echo 2.5 MiB of instructions: one message each fits a client's
    # default receive limit (4 MiB), the two together would not.
    instructions = "x" * (5 * 1024 * 1024 // 2)
    fake.add(Reply(text="Noted."))
    fake.add(Reply(text="Noted."))
    async with running_gateway(provider=provider) as gw:
        request = pb.CreateResponseRequest(input_text="Hi", instructions=instructions)
        one_each = await messages(gw.stub, request, batched=False)
        batched = await messages(gw.stub, request, batched=True)
    assert_valid_stream(flat(batched))
    assert sequence(flat(batched)) == sequence(flat(one_each))
    assert kinds(batched[0]) == ["created"], "the first event alone fills most of a message"
    assert len(batched) < len(one_each)


async def test_a_converse_session_with_batched_events_runs_one_response_after_another() -> None:
    provider = ScriptedProvider([[Text("first")], [Text("second")]])
    async with running_gateway(provider=provider) as gw:
        call = gw.stub.Converse()
        answers: list[list[pb.StreamEvent]] = []
        for text in ("one", "two"):
            await call.write(pb.ConverseRequest(create=pb.CreateResponseRequest(input_text=text, batch_events=True)))
            events: list[pb.StreamEvent] = []
            while not events or kinds(events)[-1] not in ("completed", "failed", "incomplete"):
                message = await call.read()
                assert not message.HasField("rejected"), message.rejected
                events += events_of(message)
            answers.append(events)
        await call.done_writing()
        assert await call.read() == grpc.aio.EOF
    for events in answers:
        assert_valid_stream(events)
        assert kinds(events)[-1] == "completed"
    assert answers[1][-1].completed.response.output[0].message.content[0].output_text.text == "second"


async def test_a_client_that_goes_away_while_a_batched_run_waits_leaves_its_response_cancelled(
    fake: FakeOpenAI, provider: OpenAICompatProvider
) -> None:
    fake.add(Reply(text=["never ", "finished"], hold_at=2))
    async with running_gateway(provider=provider) as gw:
        request = user("Hi")
        request.stream, request.batch_events = True, True
        call = gw.stub.CreateResponse(request)
        created = events_of(await call.read())[0]
        await fake.wait_held()
        run = gw.gateway.engine.runs.get(created.created.response.id)
        assert run is not None
        call.cancel()
        await asyncio.wait_for(run.done.wait(), 10)
        await fake.wait_for_disconnect()
        stored = await gw.store.get(run.response_id)
    assert stored is not None and stored.response.status == S.RESPONSE_STATUS_CANCELLED


async def test_a_batched_stream_closed_while_a_message_is_written_ends_its_response_cancelled() -> None:
    # grpc closes the servicer's stream when a write fails (the client reset the stream while
    # the message was on its way): the run is waiting on the model then, a step of its events
    # taken by the batching. Closing must end that wait as a cancellation, not fail.
    hold = asyncio.Event()
    provider = ScriptedProvider([ScriptedTurn([Text("never")], hold=hold)])
    store = MemoryStore()
    engine = Engine(provider, store, EngineConfig(executors=[FunctionExecutor()], default_model="m"))
    servicer = ResponsesServicer(front_of(Responses(engine, store)))
    request = pb.CreateResponseRequest(input_text="Hi", stream=True, batch_events=True)
    context = _Context()
    raw = RawRequest(request.SerializeToString(), pb.CreateResponseRequest.FromString)
    task = asyncio.create_task(servicer.CreateResponse(raw, context))
    first = pb.CreateResponseResponse.FromString((await context.written.get()).SerializeToString())
    assert kinds(events_of(first)) == ["created", "in_progress", "turn_started"]
    await provider.holding.wait()
    task.cancel()  # what grpc does to the handler when the client resets the stream
    with pytest.raises(asyncio.CancelledError):
        await task
    stored = await store.get(first.events[0].created.response.id)
    assert stored is not None and stored.response.status == S.RESPONSE_STATUS_CANCELLED


class _Context:
    def __init__(self) -> None:
        self.written: asyncio.Queue[Any] = asyncio.Queue()

    async def write(self, message: Any) -> None:
        self.written.put_nowait(message)

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def time_remaining(self) -> None:
        return None


def test_the_scenario_tests_pass_with_every_stream_batched() -> None:
    """Every stream of the scenario suites asks for batched events; the validator checks each."""
    suites = sorted(str(p) for p in (ROOT / "tests").glob("test_scenarios_*.py"))
    env = dict(os.environ, ANTWORT_TEST_BATCH_EVENTS="1")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *suites],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


class _EchoExecutor:
    """A server-side function tool `echo` that returns its arguments."""

    @property
    def kind(self) -> int:
        return pb.ToolKind.TOOL_KIND_SANDBOX

    async def can_execute(self, tool: pb.Tool) -> bool:
        return tool.WhichOneof("kind") == "function" and tool.function.name == "echo"

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: Any) -> pb.FunctionCallOutput:
        return pb.FunctionCallOutput(call_id=call.call_id, output=call.arguments)


# -- the batching of one generator's items (a unit of server/batching.py) --------------------------


async def test_items_yielded_without_a_wait_are_one_batch_and_a_wait_ends_it() -> None:
    gate = asyncio.Event()
    seen: list[str] = []

    async def source() -> AsyncIterator[str]:
        yield "a"
        yield "b"
        await gate.wait()
        yield "c"
        seen.append("held on")  # `holds` is true from here: the wait below ends nothing
        await asyncio.sleep(0)
        yield "d"
        yield "end"
        yield "after"

    got: list[list[str]] = []
    async for batch in batches(source(), holds=lambda: bool(seen), last=lambda item: item == "end"):
        got.append(batch)
        gate.set()
    assert got == [["a", "b"], ["c", "d", "end"], ["after"]]


async def test_a_consumer_gone_while_the_source_waits_ends_that_wait_as_a_cancellation() -> None:
    ended: list[str] = []

    async def source() -> AsyncIterator[int]:
        try:
            yield 1
            await asyncio.Event().wait()  # never set
            yield 2
        except asyncio.CancelledError:
            ended.append("cancelled at its wait")
            raise
        finally:
            await asyncio.sleep(0)  # a wait in its clean-up still runs
            ended.append("cleaned up")

    batched = batches(source(), holds=lambda: False, last=lambda item: False)
    assert await anext(batched) == [1]
    await batched.aclose()
    assert ended == ["cancelled at its wait", "cleaned up"]


async def test_a_cancelled_task_cancels_the_source_where_it_waits() -> None:
    waiting = asyncio.Event()
    ended: list[str] = []

    async def source() -> AsyncIterator[int]:
        yield 1
        try:
            waiting.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise

    async def consume() -> None:
        async for _ in batches(source(), holds=lambda: False, last=lambda item: False):
            pass

    task = asyncio.create_task(consume())
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ended == ["cancelled"]


class _SlowReader:
    """A Converse client (the servicer's context and its messages) that takes `stall` seconds to
    read the batch carrying `approval_requested`, then closes its side after the terminal event."""

    def __init__(self, create: pb.CreateResponseRequest, stall: float) -> None:
        self.incoming: asyncio.Queue[pb.ConverseRequest | None] = asyncio.Queue()
        self.incoming.put_nowait(pb.ConverseRequest(create=create))
        self.stall = stall
        self.events: list[pb.StreamEvent] = []

    async def requests(self) -> AsyncIterator[pb.ConverseRequest]:
        while (message := await self.incoming.get()) is not None:
            yield message

    async def write(self, sent: Any) -> None:
        message = pb.ConverseResponse.FromString(sent.SerializeToString())
        batch = events_of(message)
        if "approval_requested" in kinds(batch):
            await asyncio.sleep(self.stall)  # the write blocks: the client is not reading
        self.events += batch
        if kinds(batch)[-1] in ("completed", "failed", "incomplete", "cancelled", "requires_action"):
            self.incoming.put_nowait(None)

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def time_remaining(self) -> float:
        return 60.0

    async def abort_with_status(self, status: Any) -> None:
        raise AssertionError(f"the session ended with {status.code}: {status.details}")


async def test_an_approval_timeout_that_expires_while_a_batch_is_written_denies_the_call() -> None:
    provider = ScriptedProvider([[Call.of("echo", {"x": 1}, call_id="a")], [Text("Skipped.")]])
    store = MemoryStore()
    config = EngineConfig(executors=[FunctionExecutor(), _EchoExecutor()], default_model="m", approval_timeout=0.05)
    servicer = ResponsesServicer(front_of(Responses(Engine(provider, store, config), store)))
    tool = function_tool("echo", x="integer")
    tool.require_approval.mode = pb.ApprovalMode.APPROVAL_MODE_ALWAYS
    client = _SlowReader(pb.CreateResponseRequest(input_text="go", tools=[tool], batch_events=True), stall=0.3)
    await asyncio.wait_for(servicer.Converse(raw_converse(client.requests()), client), 10)
    assert_valid_stream(client.events)
    assert kinds(client.events)[-1] == "completed"
    response = client.events[-1].completed.response
    decision = next(i.approval_response for i in response.output if i.HasField("approval_response"))
    assert not decision.approve and decision.reason == "timeout"


@given(st.lists(st.integers(min_value=0, max_value=40)), st.integers(min_value=1, max_value=64))
def test_a_batch_is_parted_in_order_into_runs_no_larger_than_the_limit_unless_one_event_is(
    sizes: list[int], limit: int
) -> None:
    wires = [bytes([n % 256]) * size for n, size in enumerate(sizes)]
    parts = parted(wires, limit)
    assert [wire for part in parts for wire in part] == wires
    assert all(part for part in parts)
    for part in parts:
        assert len(part) == 1 or sum(map(len, part)) <= limit
    # Parted no more than needed: each run would have gone over the limit with the next one.
    for part, following in itertools.pairwise(parts):
        assert sum(map(len, part)) + len(following[0]) > limit
