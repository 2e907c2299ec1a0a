"""The background runner (responses/background.py) on a real engine and the memory store's log,
with a log whose writes fail for a while: a unit test of the Runner's write path."""

from __future__ import annotations

from typing import Any

from antwort_grpc import pb
from antwort_grpc.engine import Engine
from antwort_grpc.providers.scripted import ScriptedProvider, Text
from antwort_grpc.responses import background
from antwort_grpc.responses.background import Background, DurableSettings, Runner
from antwort_grpc.storage.base import StoredResponse
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.storage.options import StoreOptions
from antwort_grpc.storage.runlog import Checkpoint
from tests.harness import assert_valid_stream


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
    monkeypatch.setattr(background, "RETRY_WRITE", 0.01)
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
