"""A real gateway on a loopback port for the tests, and the stream validator every streaming test
applies."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc

from antwort_grpc import pb
from antwort_grpc.config import GatewaySettings
from antwort_grpc.executors.base import FunctionExecutor, ToolExecutor
from antwort_grpc.gateway import Gateway, start_gateway
from antwort_grpc.providers.base import Provider
from antwort_grpc.storage.base import ResponseStore
from antwort_grpc.storage.memory import MemoryStore

TERMINAL = {"completed", "incomplete", "failed", "cancelled", "requires_action"}
S = pb.ResponseStatus
# ANTWORT_TEST_BATCH_EVENTS=1: every stream the harness makes asks for batched events (the
# scenario tests run again so by tests/test_batched_events.py); the validator sees the same events.
BATCH_EVENTS = os.environ.get("ANTWORT_TEST_BATCH_EVENTS", "") not in ("", "0")


@dataclass
class GatewayClient:
    gateway: Gateway
    channel: grpc.aio.Channel
    stub: Any  # pb.ResponsesServiceStub (grpc stubs are untyped)

    @property
    def target(self) -> str:
        return self.gateway.target

    @property
    def store(self) -> ResponseStore:
        return self.gateway.store

    async def stream(self, request: pb.CreateResponseRequest, timeout: float | None = None) -> list[pb.StreamEvent]:
        """Stream a response; the events are checked by the stream validator."""
        request.stream = True
        if BATCH_EVENTS:
            request.batch_events = True
        messages = [events_of(message) async for message in self.stub.CreateResponse(request, timeout=timeout)]
        if BATCH_EVENTS:
            assert len(messages[0]) > 1, "batched: created leaves with in_progress"
        events = [event for message in messages for event in message]
        assert_valid_stream(events)
        return events

    async def create(self, request: pb.CreateResponseRequest, timeout: float | None = None) -> pb.Response:
        """Non-streaming: exactly one message, the terminal event with the whole Response."""
        request.stream = False
        events = await collect(self.stub.CreateResponse(request, timeout=timeout))
        assert len(events) == 1, f"non-streaming mode sent {len(events)} messages"
        assert events[0].WhichOneof("event") in TERMINAL
        return response_of(events[0])


@asynccontextmanager
async def running_gateway(
    *,
    provider: Provider,
    executors: Sequence[ToolExecutor] = (FunctionExecutor(),),
    store: ResponseStore | None = None,
    max_turns: int = 10,
    model: str = "test-model",
    **overrides: Any,
) -> AsyncIterator[GatewayClient]:
    settings = GatewaySettings(listen="127.0.0.1:0", max_turns=max_turns, model=model, **overrides)
    gateway = await start_gateway(settings, provider=provider, store=store or MemoryStore(), executors=executors)
    channel = grpc.aio.insecure_channel(gateway.target)
    try:
        yield GatewayClient(gateway, channel, pb.ResponsesServiceStub(channel))
    finally:
        await channel.close()
        await gateway.stop(0)


async def collect(call: Any) -> list[pb.StreamEvent]:
    """The events of a CreateResponse call, in order, one message or a batch of them at a time."""
    return [event async for message in call for event in events_of(message)]


def events_of(message: Any) -> list[pb.StreamEvent]:
    """The events a CreateResponseResponse or ConverseResponse carries: its `event`, or its batch
    (two or more, and then no `event`), alike for every stream's message."""
    if "events" not in message.DESCRIPTOR.fields_by_name or not message.events:
        return [message.event] if message.HasField("event") else []
    assert not message.HasField("event"), "a batch and an event in one message"
    assert len(message.events) >= 2, "a batch of one event: it goes in `event`"
    return list(message.events)


def kind(event: pb.StreamEvent) -> str:
    return event.WhichOneof("event") or ""


def kinds(events: Sequence[pb.StreamEvent]) -> list[str]:
    return [kind(e) for e in events]


def response_of(event: pb.StreamEvent) -> pb.Response:
    payload = getattr(event, kind(event))
    response: pb.Response = payload.response
    return response


def final(events: Sequence[pb.StreamEvent]) -> pb.Response:
    return response_of(events[-1])


def user(text: str) -> pb.CreateResponseRequest:
    return pb.CreateResponseRequest(input_text=text)


def function_tool(name: str, **properties: str) -> pb.Tool:
    tool = pb.Tool(function=pb.FunctionTool(name=name, description=f"the {name} tool"))
    tool.function.parameters.update({"type": "object", "properties": {p: {"type": t} for p, t in properties.items()}})
    return tool


def output_kinds(response: pb.Response) -> list[str]:
    return [item.WhichOneof("kind") or "" for item in response.output]


def output_text(response: pb.Response) -> str:
    return "".join(
        part.output_text.text
        for item in response.output
        if item.WhichOneof("kind") == "message"
        for part in item.message.content
        if part.WhichOneof("part") == "output_text"
    )


_ITEM_DELTAS = {
    "content_part_added",
    "content_part_done",
    "output_text_delta",
    "output_text_done",
    "refusal_delta",
    "refusal_done",
    "function_call_arguments_delta",
    "function_call_arguments_done",
    "reasoning_text_delta",
    "reasoning_text_done",
}


def assert_valid_stream(events: Sequence[pb.StreamEvent]) -> None:
    """The stream contract: sequence numbers 1, 2, 3, …; created first and in_progress once;
    exactly one terminal event and it is last; every item added is done; deltas of an item only
    between its added and done; the terminal response holds exactly the items that were done."""
    assert events, "empty stream"
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(1, len(events) + 1)), f"sequence numbers {numbers}"
    names = kinds(events)
    assert names[0] == "created", names
    assert names.count("created") == 1 and names.count("in_progress") == 1, names
    assert names[1] == "in_progress", names
    terminals = [n for n in names if n in TERMINAL]
    assert len(terminals) == 1 and names[-1] in TERMINAL, f"terminal events: {terminals} (last: {names[-1]})"
    open_items: dict[int, str] = {}
    done_items: dict[int, pb.Item] = {}
    for event in events:
        name = kind(event)
        payload = getattr(event, name)
        if name == "output_item_added":
            index = payload.output_index
            assert index not in open_items and index not in done_items, f"item {index} added twice"
            assert index == len(open_items) + len(done_items), f"output_index {index} out of order"
            open_items[index] = payload.item.id
        elif name == "output_item_done":
            index = payload.output_index
            assert open_items.get(index) == payload.item.id, f"item {index} done without being added"
            del open_items[index]
            done_items[index] = payload.item
        elif name in _ITEM_DELTAS:
            index = payload.output_index
            assert open_items.get(index) == payload.item_id, f"{name} for item {index} outside added..done"
        elif name.startswith("tool_execution"):
            # -1: a call an earlier response made, run now by a continuation.
            assert payload.output_index == -1 or payload.output_index in done_items, (
                f"{name} for an item that is not done"
            )
    assert not open_items, f"items added but never done: {sorted(open_items)}"
    _assert_controls(events, names)
    if "recovered" in names:
        _assert_closed_across_recovery(events)
    response = final(events)
    assert len(response.output) == len(done_items), "the terminal response does not hold every item"
    for index, item in done_items.items():
        assert response.output[index].id == item.id


def assert_valid_reattachment(read: Sequence[pb.StreamEvent], after: int, rest: Sequence[pb.StreamEvent]) -> None:
    """A stream read up to sequence number `after`, dropped, and read on by AttachResponse with
    `starting_after=after` (any replica): the attach brings every later event exactly once, in
    order, to the terminal event, and the two together are one valid stream. A run resumed on
    another replica keeps counting (its `recovered` event follows the lost replica's last)."""
    kept = [e for e in read if e.sequence_number <= after]
    assert [e.sequence_number for e in kept] == list(range(1, after + 1)), "the first read is not 1..after"
    numbers = [e.sequence_number for e in rest]
    assert numbers == list(range(after + 1, after + 1 + len(rest))), f"re-attached after {after}: {numbers}"
    assert_valid_stream([*kept, *rest])


def _assert_closed_across_recovery(events: Sequence[pb.StreamEvent]) -> None:
    """A background run resumed on another replica leaves nothing of the lost replica open: the
    turn it stopped in completes (`interrupted` with the recovery's reason) before another
    starts, every tool execution it began ends (failed, or run again: in progress once more only
    after it ended), every content part added is done, and a begun item keeps its logged text."""
    turn, reason, lost = 0, "", 0
    running: set[str] = set()
    parts: set[tuple[int, int]] = set()
    texts: dict[tuple[int, int], str] = {}
    for event in events:
        name = kind(event)
        payload = getattr(event, name)
        if name == "recovered":
            reason, lost = payload.reason, turn
        elif name == "turn_started":
            assert not turn, f"turn {payload.turn} started while turn {turn} was open"
            turn = payload.turn
        elif name == "turn_completed":
            assert payload.turn == turn, f"turn_completed {payload.turn} for open turn {turn}"
            expected = reason if turn == lost else ""
            assert payload.interrupted == expected, f"turn {turn} completed {payload.interrupted!r}, not {expected!r}"
            lost = 0 if turn == lost else lost
            turn = 0
        elif name == "tool_execution_in_progress":
            assert payload.call_id not in running, f"tool execution {payload.call_id} begun twice"
            running.add(payload.call_id)
        elif name in ("tool_execution_completed", "tool_execution_failed"):
            assert payload.call_id in running, f"{name} for {payload.call_id}, which was not running"
            running.discard(payload.call_id)
        elif name == "content_part_added":
            parts.add((payload.output_index, payload.content_index))
        elif name == "output_text_delta":
            key = (payload.output_index, payload.content_index)
            texts[key] = texts.get(key, "") + payload.delta
        elif name == "content_part_done":
            parts.discard((payload.output_index, payload.content_index))
            if payload.part.WhichOneof("part") == "output_text":
                logged = texts.get((payload.output_index, payload.content_index), "")
                assert payload.part.output_text.text == logged, "a part done without the text its deltas gave"
    assert not parts, f"content parts added but never done: {sorted(parts)}"
    if kind(events[-1]) in ("completed", "requires_action"):
        assert not turn, f"turn {turn} never completed"
        assert not running, f"tool executions never ended: {sorted(running)}"


def _assert_controls(events: Sequence[pb.StreamEvent], names: list[str]) -> None:
    """The interactive vocabulary: turn numbers increase by one; paused and resumed alternate
    (a pause may be ended by the terminal event); every call of an approval_requested event is
    followed by its decision (an approval_response item, or the call's output when a steering
    message superseded it) or by the terminal event."""
    turns = [e.turn_started.turn for e in events if kind(e) == "turn_started"]
    assert turns == list(range(1, len(turns) + 1)), f"turn_started numbers {turns}"
    pauses = [n for n in names if n in ("paused", "resumed")]
    assert all(p == ("paused" if i % 2 == 0 else "resumed") for i, p in enumerate(pauses)), pauses
    waiting: set[str] = set()
    for event in events:
        name = kind(event)
        if name == "approval_requested":
            waiting |= {r.call_id for r in event.approval_requested.requests}
        elif name == "output_item_done":
            item = event.output_item_done.item
            which = item.WhichOneof("kind")
            if which == "approval_response":
                waiting.discard(item.approval_response.call_id)
            elif which == "function_call_output":
                waiting.discard(item.function_call_output.call_id)
        elif name in TERMINAL:
            waiting.clear()
    assert not waiting, f"approval requests never decided: {sorted(waiting)}"
