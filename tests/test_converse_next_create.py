"""A Converse session answers a response's terminal event with its next create at once: the
create starts the next response, even when it arrives while the terminal event is still being
written (a client in another process reads it and answers before the server's write completes).

A unit test of the servicer's session with a context whose write of the terminal event lets the
client's next create in before it returns — the timing a Go client produced under load."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from antwort_grpc import pb
from antwort_grpc.engine import Engine, EngineConfig
from antwort_grpc.executors.base import FunctionExecutor
from antwort_grpc.providers.scripted import Call, ScriptedProvider
from antwort_grpc.responses.service import Responses
from antwort_grpc.server.servicer import ResponsesServicer
from antwort_grpc.storage.memory import MemoryStore
from tests.fakes import front_of, raw_converse
from tests.harness import function_tool

TOOLS = [function_tool("send_mail", to="string")]


class QuickClient:
    """The servicer context and the client's messages: it answers each requires_action with the
    next create during the write that delivers it, then lets the server's reader run."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds
        self.incoming: asyncio.Queue[pb.ConverseRequest | None] = asyncio.Queue()
        self.written: list[pb.ConverseResponse] = []
        self.handed_out = 0

    def create(self, text: str) -> None:
        self.incoming.put_nowait(pb.ConverseRequest(create=pb.CreateResponseRequest(input_text=text, tools=TOOLS)))

    async def requests(self) -> AsyncIterator[pb.ConverseRequest]:
        while (message := await self.incoming.get()) is not None:
            yield message

    async def write(self, sent: Any) -> None:
        # What the server writes serializes to a ConverseResponse (built or not).
        message = pb.ConverseResponse.FromString(sent.SerializeToString())
        self.written.append(message)
        if message.event.HasField("requires_action"):
            self.handed_out += 1
            if self.handed_out < self.rounds:
                self.create(f"again ({self.handed_out})")
            else:
                self.incoming.put_nowait(None)
            for _ in range(5):  # the write completes only after the client's answer came in
                await asyncio.sleep(0)

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def time_remaining(self) -> float:
        return 60.0

    async def abort_with_status(self, status: Any) -> None:
        raise AssertionError(f"the session ended with {status.code}: {status.details}")


async def test_a_create_that_arrives_while_the_terminal_event_is_written_starts_the_next_response() -> None:
    provider = ScriptedProvider([[Call.of("send_mail", {"to": "bob"}, call_id="m")]], repeat=True)
    store = MemoryStore()
    engine = Engine(provider, store, EngineConfig(executors=[FunctionExecutor()], default_model="m"))
    servicer = ResponsesServicer(front_of(Responses(engine, store)))
    client = QuickClient(rounds=3)
    client.create("Mail Bob.")
    await asyncio.wait_for(servicer.Converse(raw_converse(client.requests()), client), 10)
    rejected = [m.rejected.message for m in client.written if m.HasField("rejected")]
    assert rejected == []
    assert client.handed_out == 3
