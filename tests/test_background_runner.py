"""The background runner (durable/runner.py, durable/takeover.py) on a real engine and the memory store's log,
with a log whose writes fail for a while: a unit test of the Runner's write path."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from antwort_grpc import pb
from antwort_grpc.durable import runner as runner_module
from antwort_grpc.durable import takeover
from antwort_grpc.durable.runner import Runner
from antwort_grpc.durable.settings import DurableSettings
from antwort_grpc.durable.takeover import Background
from antwort_grpc.engine import Engine
from antwort_grpc.engine.history import load_conversation
from antwort_grpc.providers.base import Completion, FinishReason, ProviderEvent, TextDelta, TurnEnd, TurnRequest
from antwort_grpc.providers.scripted import ScriptedProvider, Text
from antwort_grpc.storage.base import StoredResponse
from antwort_grpc.storage.conversations import Entry
from antwort_grpc.storage.memory import MemoryDatabase, MemoryStore
from antwort_grpc.storage.options import StoreOptions
from antwort_grpc.storage.runlog import Checkpoint
from tests.harness import assert_valid_stream
from tests.storage.conftest import FakeClock


class FlakyLog:
    """The memory store's RunLog, whose first `failures` appends raise (a database blip)."""

    def __init__(self, inner: Any, failures: int) -> None:
        self.inner = inner
        self.failures = failures

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def append(self, response_id: str, events: Any, **kwargs: Any) -> bool:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("the database went away for a moment")
        return bool(await self.inner.append(response_id, events, **kwargs))


async def test_a_failed_log_write_is_retried_and_readers_never_see_a_gap(monkeypatch: Any) -> None:
    monkeypatch.setattr(runner_module, "RETRY_WRITE", 0.01)
    store = MemoryStore()
    engine = Engine(ScriptedProvider([[Text("one two three four")]]), store)
    request = pb.CreateResponseRequest(model="scripted", input_text="count", stream=True, background=True)
    run = await engine.start(request)
    log = FlakyLog(store.runlog, failures=3)
    await log.begin(run.response_id, "", request.SerializeToString(), 10.0)
    runner = Runner(run, log, DurableSettings())
    runner.start()
    assert runner.task is not None
    await runner.task
    events = [pb.StreamEvent.FromString(data) for _, data in await store.runlog.events(run.response_id, 0, 1000)]
    assert_valid_stream(events)
    state = await store.runlog.state(run.response_id, "")
    assert state is not None and state.ended and state.last_sequence_number == len(events)
    # The turn's checkpoint went in with its events, after the retries.
    checkpoint = store.database.runs.runs[run.response_id].checkpoint
    assert isinstance(checkpoint, Checkpoint) and checkpoint.turn == 0


async def test_a_run_that_ended_before_its_terminal_event_was_logged_gets_it_and_does_not_run_again() -> None:
    store = MemoryStore()
    provider = ScriptedProvider([[Text("never asked")]])
    engine = Engine(provider, store)
    # What a replica that died just after storing the final response left: the log without its end.
    response = pb.Response(id="resp_done", model="scripted", status=pb.ResponseStatus.RESPONSE_STATUS_COMPLETED)
    await store.save(StoredResponse(response))
    dead = MemoryStore(StoreOptions(instance_id="dead"), store.database)
    await dead.runlog.begin("resp_done", "", b"", 0.0)
    await dead.runlog.append("resp_done", [(n, b"x") for n in range(1, 6)])
    taking = Background(engine, store, store.runlog, DurableSettings())
    assert await taking.take_over() == 1
    state = await store.runlog.state("resp_done", "")
    assert state is not None and state.ended and state.last_sequence_number == 6
    (last,) = await store.runlog.events("resp_done", 5, 10)
    assert pb.StreamEvent.FromString(last[1]).completed.response == response
    assert provider.requests == []


async def test_the_next_look_for_lost_runs_is_due_when_a_lease_of_another_replica_runs_out() -> None:
    clock = FakeClock()
    database = MemoryDatabase()
    settings = DurableSettings(lease_seconds=10.0)
    dead = MemoryStore(StoreOptions(clock=clock), database)
    survivor = MemoryStore(StoreOptions(clock=clock), database)
    engine = Engine(ScriptedProvider([[Text("unused")]]), survivor)
    look = Background(engine, survivor, survivor.runlog, settings)
    assert await look.next_look() == settings.upkeep_interval
    # The replica that died renewed its lease last 9 s ago: it runs out in 1 s, sooner than a
    # quarter lease; the survivor looks then, not a quarter lease later.
    await dead.runlog.begin("resp_1", "", b"request", settings.lease_seconds)
    clock.advance(9)
    assert await look.next_look() == pytest.approx(1.0 + takeover.EXPIRY_MARGIN)
    clock.advance(2)
    assert await look.next_look() == settings.upkeep_interval


class Stalls:
    """A model that streams a few words (each one token, with its log probability when
    `logprobs`) and then never goes on (its replica is about to die)."""

    def __init__(self, *words: str, logprobs: bool = False) -> None:
        self.words = words
        self.logprobs = logprobs
        self.streamed = asyncio.Event()

    async def stream(self, turn: TurnRequest) -> AsyncIterator[ProviderEvent]:
        for n, word in enumerate(self.words):
            yield TextDelta(word, token_logprobs(word, n) if self.logprobs else ())
        self.streamed.set()
        await asyncio.Event().wait()
        yield TurnEnd(FinishReason.STOP)  # never reached

    async def complete(self, turn: TurnRequest) -> Completion:
        raise AssertionError("background runs stream")


def token_logprobs(word: str, n: int) -> tuple[pb.TokenLogprob, ...]:
    """The word as one token, with a log probability of its own and one alternative."""
    top = pb.TopLogprob(token=word.upper(), logprob=-5.0 - n, bytes=list(word.upper().encode()))
    return (pb.TokenLogprob(token=word, logprob=-0.5 - n, bytes=list(word.encode()), top_logprobs=[top]),)


async def logged(store: MemoryStore, response_id: str, delta: str) -> None:
    """Returns once the log holds that text delta."""
    async with asyncio.timeout(10):
        while True:
            events = [pb.StreamEvent.FromString(data) for _, data in await store.runlog.events(response_id, 0, 999)]
            if any(e.output_text_delta.delta == delta for e in events):
                return
            await asyncio.sleep(0.01)


async def lost_mid_message(
    request: pb.CreateResponseRequest, stalls: Stalls, survivors: list[Background] | None = None
) -> list[pb.StreamEvent]:
    """The run started on a replica whose model stalls mid-message, that replica lost (what it
    produced written, its lease left to run out), the run taken over by another whose model
    answers "Hello world, again." (then "Fine." to a later turn): the events of the whole log.
    `survivors` is given the replica that took it over."""
    clock = FakeClock()
    database = MemoryDatabase()
    settings = DurableSettings(lease_seconds=10.0)
    lost_store = MemoryStore(StoreOptions(clock=clock, instance_id="lost"), database)
    lost = Background(Engine(stalls, lost_store), lost_store, lost_store.runlog, settings)
    run = await lost.engine.start(request)
    runner = await lost.begin(run)
    await stalls.streamed.wait()
    await logged(lost_store, run.response_id, stalls.words[-1])
    # The replica dies: what it produced was written, its lease stays until it runs out.
    await runner.hand_over()
    clock.advance(settings.lease_seconds + 1)
    survivor_store = MemoryStore(StoreOptions(clock=clock, instance_id="survivor"), database)
    survivor = Background(
        Engine(ScriptedProvider([[Text("Hello world, again.")], [Text("Fine.")]]), survivor_store),
        survivor_store,
        survivor_store.runlog,
        settings,
    )
    assert await survivor.take_over() == 1
    if survivors is not None:
        survivors.append(survivor)
    resumed = survivor.runners[run.response_id]
    assert resumed.task is not None
    await resumed.task
    return [pb.StreamEvent.FromString(data) for _, data in await survivor_store.runlog.events(run.response_id, 0, 999)]


async def test_a_run_resumed_after_its_replica_died_mid_message_closes_the_turn_and_keeps_the_logged_text() -> None:
    request = pb.CreateResponseRequest(model="scripted", input_text="greet", stream=True, background=True)
    events = await lost_mid_message(request, Stalls("Hello ", "wor"))
    assert_valid_stream(events)
    names = [e.WhichOneof("event") for e in events]
    at = names.index("recovered")
    closing = names[at + 1 : names.index("turn_started", at)]
    assert closing == ["output_text_done", "content_part_done", "output_item_done", "turn_decided", "turn_completed"]
    assert events[at + 1].output_text_done.text == "Hello wor"
    assert events[at + 4].turn_decided.decision == pb.TurnDecision.TURN_DECISION_INTERRUPTED
    assert events[at + 5].turn_completed.turn == 1 and events[at + 5].turn_completed.interrupted == "replica_lost"
    final = events[-1].completed.response
    superseded, answer = final.output
    assert superseded.status == pb.ItemStatus.ITEM_STATUS_INCOMPLETE
    assert superseded.message.content[0].output_text.text == "Hello wor"
    assert answer.message.content[0].output_text.text == "Hello world, again."


async def test_a_run_resumed_mid_message_keeps_the_log_probabilities_of_the_text_logged_before() -> None:
    request = pb.CreateResponseRequest(
        model="scripted", input_text="greet", stream=True, background=True, output_logprobs=True, top_logprobs=1
    )
    words = ("Hello ", "wor")
    events = await lost_mid_message(request, Stalls(*words, logprobs=True))
    assert_valid_stream(events)
    expected = [p for n, word in enumerate(words) for p in token_logprobs(word, n)]
    at = [e.WhichOneof("event") for e in events].index("recovered")
    # What readers were sent before the takeover, and what the part and the item are closed with.
    logged_probs = [p for e in events[:at] for p in e.output_text_delta.logprobs]
    assert logged_probs == expected
    part_done, item_done = events[at + 2].content_part_done, events[at + 3].output_item_done
    assert list(part_done.part.output_text.logprobs) == expected
    assert list(item_done.item.message.content[0].output_text.logprobs) == expected
    superseded = events[-1].completed.response.output[0]
    assert superseded.message.content[0].output_text.text == "Hello wor"
    assert list(superseded.message.content[0].output_text.logprobs) == expected


async def test_a_later_response_is_not_shown_what_the_lost_replica_began_and_the_survivor_did_again() -> None:
    request = pb.CreateResponseRequest(model="scripted", input_text="greet", stream=True, background=True)
    survivors: list[Background] = []
    events = await lost_mid_message(request, Stalls("Hello ", "wor"), survivors)
    superseded, answer = events[-1].completed.response.output
    assert superseded.superseded and not answer.superseded
    engine = survivors[0].engine
    later = await engine.start(
        pb.CreateResponseRequest(
            model="scripted", input_text="and?", previous_response_id=events[-1].completed.response.id
        )
    )
    async for _ in later.events():
        pass
    provider = engine.provider
    assert isinstance(provider, ScriptedProvider)
    shown = [
        part.output_text.text
        for item in provider.requests[-1].items
        if item.WhichOneof("kind") == "message"
        for part in item.message.content
    ]
    assert "Hello wor" not in shown
    assert "Hello world, again." in shown


async def test_a_conversation_holding_a_superseded_item_does_not_show_it_to_the_model() -> None:
    store = MemoryStore(StoreOptions(), MemoryDatabase())
    events = await lost_mid_message(
        pb.CreateResponseRequest(model="scripted", input_text="greet", stream=True, background=True),
        Stalls("Hello ", "wor"),
    )
    output = list(events[-1].completed.response.output)
    await store.conversations.create(pb.Conversation(id="conv_1"), [], "")
    assert await store.conversations.append("conv_1", [Entry(item, from_model=True) for item in output], "")
    history = await load_conversation(store, "conv_1", owner="", max_bytes=1 << 20)
    assert [item.id for item in history.items] == [output[1].id]
