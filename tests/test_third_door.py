"""The third door (tests/jsonl_door.py, built from docs/engine.md's recipe alone) runs the scenarios
the gRPC and HTTP doors run: a create streamed and not, background and attach, a control, a
requires_action round trip, a conversation and its compaction, and every class of error — all of
it the core's, none of it the door's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from google.protobuf import json_format

from antwort_grpc import pb
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text
from antwort_grpc.providers.scripted import Turn as ScriptedTurn
from tests.harness import assert_valid_stream, function_tool, kinds, running_gateway
from tests.jsonl_door import JsonLinesDoor

S = pb.ResponseStatus
WEATHER = function_tool("get_weather", city="string")


class Door:
    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url, self.session = url, session

    async def lines(self, method: str, body: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
        async with self.session.post(f"{self.url}/rpc/{method}", json=body) as reply:
            text = await reply.text()
            return reply.status, [json.loads(line) for line in text.splitlines() if line]

    async def events(self, method: str, body: dict[str, Any]) -> list[pb.StreamEvent]:
        status, lines = await self.lines(method, body)
        assert status == 200, lines
        return [json_format.ParseDict(line, pb.StreamEvent()) for line in lines]


@pytest.fixture
async def door() -> AsyncIterator[tuple[Door, Any, asyncio.Event]]:
    release = asyncio.Event()
    provider = ScriptedProvider(
        [
            [Text("Hello there.")],
            [Call.of("get_weather", {"city": "Paris"}, call_id="c1")],
            [Text("Sunny in Paris.")],
            ScriptedTurn([Text("Slow.")], hold=release),
        ]
    )
    async with running_gateway(provider=provider, max_running_responses=2) as client:
        third = JsonLinesDoor(client.gateway.core.front)
        await third.start("127.0.0.1:0")
        await client.gateway.open(third)
        async with aiohttp.ClientSession() as session:
            client.provider = provider
            yield Door(third.url, session), client, release
        release.set()


async def test_a_create_streamed_and_not(door: tuple[Door, Any, asyncio.Event]) -> None:
    third, _, _ = door
    events = await third.events("CreateResponse", {"inputText": "Hi", "stream": True})
    assert_valid_stream(events)
    assert kinds(events)[-1] == "completed"
    status, lines = await third.lines("CreateResponse", {"inputText": "Where?", "tools": [_tool()]})
    assert status == 200 and len(lines) == 1 and "requiresAction" in lines[0]


async def test_a_requires_action_round_trip(door: tuple[Door, Any, asyncio.Event]) -> None:
    third, _, _ = door
    await third.events("CreateResponse", {"inputText": "Hi"})
    first = await third.events("CreateResponse", {"inputText": "Weather?", "tools": [_tool()]})
    paused = first[-1].requires_action.response
    assert paused.status == S.RESPONSE_STATUS_REQUIRES_ACTION
    output = {"functionCallOutput": {"callId": "c1", "output": "sunny"}}
    body = {"previousResponseId": paused.id, "inputItems": {"items": [output]}, "tools": [_tool()], "stream": True}
    done = await third.events("CreateResponse", body)
    assert_valid_stream(done)
    assert done[-1].completed.response.status == S.RESPONSE_STATUS_COMPLETED


async def test_background_attach_and_a_control(door: tuple[Door, Any, asyncio.Event]) -> None:
    third, _, _ = door
    for _ in range(3):  # the held turn is the fourth of the script
        await third.events("CreateResponse", {"inputText": "x", "tools": [_tool()]})
    started = await third.events("CreateResponse", {"inputText": "slow", "background": True})
    response_id = started[0].created.response.id
    status, lines = await third.lines("ControlResponse", {"responseId": response_id, "control": {"cancel": {}}})
    assert status == 200, lines
    events = await third.events("AttachResponse", {"responseId": response_id})
    assert_valid_stream(events)
    assert kinds(events)[-1] == "cancelled"
    status, lines = await third.lines("GetResponse", {"responseId": response_id})
    assert lines[0]["response"]["status"] == "RESPONSE_STATUS_CANCELLED"


@pytest.mark.parametrize(
    ("method", "body", "status", "code"),
    [
        ("CreateResponse", {"inputText": "x", "temperature": 7}, 400, "INVALID_ARGUMENT"),
        ("CreateResponse", {"inputTexts": "x"}, 400, "INVALID_ARGUMENT"),
        ("GetResponse", {"responseId": "resp_0123456789abcdef0123456789abcdef"}, 404, "NOT_FOUND"),
        ("AttachResponse", {"responseId": "resp_0123456789abcdef0123456789abcdef"}, 404, "NOT_FOUND"),
    ],
)
async def test_errors_before_any_event(
    door: tuple[Door, Any, asyncio.Event], method: str, body: dict[str, Any], status: int, code: str
) -> None:
    third, _, _ = door
    got, lines = await third.lines(method, body)
    assert (got, lines[0]["error"]["code"]) == (status, code), lines


async def test_a_control_for_an_ended_response_and_an_attach_past_its_log(
    door: tuple[Door, Any, asyncio.Event],
) -> None:
    third, _, _ = door
    started = await third.events("CreateResponse", {"inputText": "Hi", "background": True})
    response_id = started[0].created.response.id
    events = await third.events("AttachResponse", {"responseId": response_id})
    got, lines = await third.lines("ControlResponse", {"responseId": response_id, "control": {"pause": {}}})
    assert (got, lines[0]["error"]["code"]) == (409, "FAILED_PRECONDITION")
    after = events[-1].sequence_number + 5
    got, lines = await third.lines("AttachResponse", {"responseId": response_id, "startingAfter": after})
    assert (got, lines[0]["error"]["code"]) == (400, "OUT_OF_RANGE")


async def test_past_capacity_and_while_shutting_down(door: tuple[Door, Any, asyncio.Event]) -> None:
    third, client, release = door
    for _ in range(3):
        await third.events("CreateResponse", {"inputText": "x", "tools": [_tool()]})
    # Two responses may run at once: the held one and one more; the third is refused.
    holding = asyncio.create_task(third.events("CreateResponse", {"inputText": "slow"}))
    await asyncio.wait_for(client.provider.holding.wait(), 10)
    client.gateway.core.edge.admission.max_running = 1
    got, lines = await third.lines("CreateResponse", {"inputText": "more"})
    assert (got, lines[0]["error"]["code"]) == (429, "RESOURCE_EXHAUSTED")
    release.set()
    await holding
    client.gateway.core.front.closing = True
    got, lines = await third.lines("CreateResponse", {"inputText": "more"})
    assert (got, lines[0]["error"]["code"]) == (503, "UNAVAILABLE")


async def test_a_conversation_its_items_and_its_compaction() -> None:
    provider = ScriptedProvider([[Text("Hello, Ada.")], [Text("Ada said hello.")]])
    async with running_gateway(provider=provider) as client, aiohttp.ClientSession() as session:
        door = JsonLinesDoor(client.gateway.core.front)
        await door.start("127.0.0.1:0")
        await client.gateway.open(door)
        third = Door(door.url, session)
        said = {"message": {"role": "ROLE_USER", "content": [{"inputText": {"text": "I am Ada."}}]}}
        _, created = await third.lines("CreateConversation", {"items": [said], "metadata": {"k": "v"}})
        conversation = created[0]["conversation"]
        kept = {"conversationId": conversation["id"]}
        events = await third.events("CreateResponse", {"inputText": "Greet me.", **kept})
        assert events[-1].completed.response.conversation_id == conversation["id"]
        _, listed = await third.lines("ListConversationItems", kept)
        items = listed[0]["items"]
        assert [next(iter(i["message"]["content"][0].values()))["text"] for i in items] == [
            "I am Ada.",
            "Greet me.",
            "Hello, Ada.",
        ]
        _, got = await third.lines("GetConversationItem", {**kept, "itemId": items[0]["id"]})
        assert got[0]["item"] == items[0]
        _, compacted = await third.lines("CompactConversation", kept)
        assert "Ada said hello." in compacted[0]["summary"]["message"]["content"][0]["inputText"]["text"]
        assert provider.requests[-1].items[0].message.content[0].input_text.text == "I am Ada."
        _, updated = await third.lines("UpdateConversation", {**kept, "metadata": {"k": "w"}})
        assert updated[0]["conversation"]["metadata"] == {"k": "w"}
        _, left = await third.lines("DeleteConversationItem", {**kept, "itemId": items[0]["id"]})
        assert left[0]["conversation"]["id"] == conversation["id"]
        _, added = await third.lines("CreateConversationItems", {**kept, "items": [said]})
        assert added[0]["firstId"] and not added[0].get("hasMore")
        _, deleted = await third.lines("DeleteConversation", kept)
        assert deleted[0] == {**kept, "deleted": True}
        status, gone = await third.lines("GetConversation", kept)
        assert (status, gone[0]["error"]["code"]) == (404, "NOT_FOUND")


def _tool() -> dict[str, Any]:
    return json_format.MessageToDict(WEATHER)
