"""Requests at the size limits: the largest the gateway admits and what it does with them. A request
past ANTWORT_MAX_REQUEST_BYTES is refused before it is parsed, naming the field that holds most of
it; one within it has its costly steps made away from the event loop (the checks of its unseen
schemas in the worker process)."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import grpc
import pytest

from antwort_grpc import offload, pb
from antwort_grpc.engine import emitter as emitter_module
from antwort_grpc.engine import loop as engine_loop
from antwort_grpc.providers.base import TurnRequest
from antwort_grpc.providers.openai import request as request_module
from antwort_grpc.providers.openai.request import build_body
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text
from antwort_grpc.responses import schemas
from tests.harness import collect, function_tool, output_text, running_gateway
from tests.test_interactive_runs import Session
from tests.test_validation_and_rpcs import rejected, violations_of

LIMIT = 64 * 1024


def long_items(count: int, chars: int) -> pb.ItemList:
    part = pb.ContentPart(input_text=pb.InputText(text="x" * chars))
    return pb.ItemList(items=[pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[part]))] * count)


async def test_a_request_past_the_size_limit_is_refused_before_it_is_parsed_naming_its_largest_field() -> None:
    provider = ScriptedProvider([[Text("within")]], repeat=True)
    async with running_gateway(provider=provider, max_request_bytes=LIMIT) as gw:
        over_in_items = pb.CreateResponseRequest(input_items=long_items(20, 4000))
        found = await rejected(gw, over_in_items)
        assert "ANTWORT_MAX_REQUEST_BYTES" in found["input_items.items"], found
        assert f"at most {LIMIT}" in found["input_items.items"]
        found = await rejected(gw, pb.CreateResponseRequest(input_text="y" * (LIMIT + 1)))
        assert list(found) == ["input_text"], found
        assert provider.requests == [], "the model was never asked"
        # Just within it, the same kind of request runs.
        within = pb.CreateResponseRequest(input_items=long_items(10, 4000))
        assert output_text(await gw.create(within)) == "within"


async def test_a_converse_create_past_the_size_limit_ends_the_stream_naming_its_field() -> None:
    provider = ScriptedProvider([[Text("never")]])
    async with running_gateway(provider=provider, max_request_bytes=LIMIT) as gw:
        session = Session(gw)
        await session.start(pb.CreateResponseRequest(input_items=long_items(20, 4000)))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await session.until("terminal")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "create.input_items.items" in violations_of(caught.value)


async def test_the_size_limit_is_off_at_zero() -> None:
    provider = ScriptedProvider([[Text("big")]])
    async with running_gateway(provider=provider, max_request_bytes=0) as gw:
        request = pb.CreateResponseRequest(input_items=long_items(20, 4000))
        assert output_text(await gw.create(request)) == "big"


def unseen_tools(count: int, properties: int, tag: str) -> list[pb.Tool]:
    tools = []
    for n in range(count):
        tool = function_tool(f"tool_{n}")
        described = {f"p{m}": {"type": "string", "description": f"{tag} {n} " + "d" * 40} for m in range(properties)}
        tool.function.parameters.update({"type": "object", "properties": described})
        tools.append(tool)
    return tools


async def test_unseen_schemas_of_a_large_request_are_checked_in_the_worker_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handed: list[int] = []
    in_process = schemas.in_process

    def counting(function: Any, batch: list[bytes], *args: Any) -> Any:
        handed.append(len(batch))
        return in_process(function, batch, *args)

    monkeypatch.setattr(schemas, "in_process", counting)
    # 16 schemas of about 20 KiB, none seen before: past IN_PROCESS_BYTES together.
    tools = unseen_tools(16, 300, tag=f"process {id(handed)}")
    assert sum(t.function.parameters.ByteSize() for t in tools) > schemas.IN_PROCESS_BYTES
    broken = tools[11].function.parameters
    broken.fields["properties"].struct_value.fields["p7"].struct_value.fields["type"].string_value = "no-such-type"
    async with running_gateway(provider=ScriptedProvider([[Text("ok")]], repeat=True)) as gw:
        found = await rejected(gw, pb.CreateResponseRequest(input_text="hi", tools=tools))
        assert handed == [16], "the 16 unseen schemas went to the worker process together"
        assert list(found) == ["tools[11].function.parameters"], found
        assert "not a valid JSON Schema" in found["tools[11].function.parameters"]
        # The verdicts came back into the cache: the valid ones are not checked again, and the
        # backend body is built from the JSON texts the process made.
        del tools[11]
        events = await collect(gw.stub.CreateResponse(pb.CreateResponseRequest(input_text="hi", tools=tools)))
        assert handed == [16]
        assert events[-1].WhichOneof("event") == "completed"


@pytest.fixture
def made_away(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of what the engine hands to its worker thread, in order."""
    names: list[str] = []
    off_loop = engine_loop.off_loop

    async def watched(function: Any, *args: Any, **kwargs: Any) -> Any:
        names.append(function.__name__)
        return await off_loop(function, *args, **kwargs)

    monkeypatch.setattr(engine_loop, "off_loop", watched)
    return names


async def test_a_large_request_runs_with_its_items_and_tools_made_off_the_event_loop(made_away: list[str]) -> None:
    provider = ScriptedProvider([[Text("read them all")]])
    tools = unseen_tools(9, 2, tag="echoed")
    request = pb.CreateResponseRequest(input_items=long_items(300, 10), tools=tools, stream=True)
    request.input_items.items[0].id = "msg_mine"
    async with running_gateway(provider=provider) as gw:
        events = await collect(gw.stub.CreateResponse(request))
    assert made_away == ["_made"]
    created, completed = events[0].created.response, events[-1].completed.response
    assert [t.function.name for t in created.tools] == [f"tool_{n}" for n in range(9)]
    assert list(completed.tools) == list(tools)
    assert output_text(completed) == "read them all"
    # A small request's are made where it runs.
    async with running_gateway(provider=ScriptedProvider([[Text("small")]])) as gw:
        assert output_text(await gw.create(pb.CreateResponseRequest(input_items=long_items(3, 10)))) == "small"
    assert made_away == ["_made"]
    sent = provider.requests[0]
    assert len(sent.items) == 300
    assert sent.items[0].id == "msg_mine"
    assert all(item.id.startswith("msg_") for item in sent.items)
    assert len({item.id for item in sent.items}) == 300


async def test_lifecycle_events_echoing_large_tools_are_made_off_the_event_loop_and_carry_every_tool(
    made_away: list[str],
) -> None:
    # 12 tools of about 8 KiB: past the bytes that make a lifecycle event costly, under the rest.
    tools = unseen_tools(12, 120, tag="lifecycle")
    assert sum(t.ByteSize() for t in tools) > emitter_module.HEAVY_TOOLS_BYTES
    provider = ScriptedProvider([[Text("all of them")], [Call.of("tool_3", {"p0": "x"}, call_id="c1")]])
    async with running_gateway(provider=provider) as gw:
        answered = await collect(
            gw.stub.CreateResponse(pb.CreateResponseRequest(input_text="hi", tools=tools, stream=True))
        )
        paused = await collect(
            gw.stub.CreateResponse(pb.CreateResponseRequest(input_text="go", tools=tools, stream=True))
        )
    assert made_away == ["_made", "opening", "terminal"] * 2
    kinds = [e.WhichOneof("event") for e in answered]
    assert kinds[:2] == ["created", "in_progress"] and kinds[-1] == "completed"
    for event in (answered[0], answered[1], answered[-1], paused[0], paused[-1]):
        response = getattr(event, event.WhichOneof("event")).response
        assert list(response.tools) == tools, event.WhichOneof("event")
    assert [e.sequence_number for e in answered] == list(range(1, len(answered) + 1))
    assert output_text(answered[-1].completed.response) == "all of them"
    assert paused[-1].WhichOneof("event") == "requires_action"
    assert [c.call_id for c in paused[-1].requires_action.tool_calls] == ["c1"]
    # Small tools: made where the response runs.
    made_away.clear()
    async with running_gateway(provider=ScriptedProvider([[Text("small")]])) as gw:
        await collect(gw.stub.CreateResponse(pb.CreateResponseRequest(input_text="hi", tools=tools[:1], stream=True)))
    assert made_away == []


def test_a_body_of_many_messages_is_encoded_in_pieces_to_the_same_text(monkeypatch: pytest.MonkeyPatch) -> None:
    # The most messages one call into the JSON encoder was given: it holds the GIL throughout.
    most: list[int] = [0]

    class Counting:
        loads = staticmethod(json.loads)

        @staticmethod
        def dumps(value: Any) -> str:
            messages = value if isinstance(value, list) else (value or {}).get("messages") or []
            most[0] = max(most[0], len(messages))
            return json.dumps(value)

    monkeypatch.setattr(request_module, "json", Counting)
    items = list(long_items(3 * request_module.ENCODED_TOGETHER + 5, 20).items)
    items[7].message.content[0].input_text.text = 'quotes " and "messages": null inside'
    turn = TurnRequest(model='a "messages": null model', instructions="be brief", items=items, tools=[])
    assert request_module.encode_body(turn, stream=True) == json.dumps(build_body(turn, stream=True)).encode()
    assert most[0] == request_module.ENCODED_TOGETHER
    tools = [tool.function for tool in unseen_tools(3, 2, tag="body")]
    with_tools = TurnRequest(model="m", instructions="", items=items, tools=tools)
    sent = json.loads(request_module.encode_body(with_tools, stream=False))
    assert sent == build_body(with_tools, stream=False)
    assert len(sent["messages"]) == len(items)


def test_a_worker_process_that_died_is_replaced_and_the_schemas_are_still_checked() -> None:
    def problems(tag: str) -> list[str]:
        tools = unseen_tools(16, 300, tag=tag)
        broken = tools[3].function.parameters
        broken.fields["type"].string_value = "array"
        found = schemas.parameters_problems(
            [tool.function.parameters for tool in tools], max_bytes=64 * 1024, max_depth=20, in_worker=True
        )
        return [f"{n}: {problem}" for n, problem in enumerate(found) if problem]

    assert problems("first") == ["3: the arguments schema must have type 'object'"]
    process = offload._process
    assert process is not None
    for pid in list(process._processes):  # what a kill -9 or the OOM killer does
        os.kill(pid, signal.SIGKILL)
    # The schemas of the request that found it dead are checked all the same, in this thread...
    assert problems("second") == ["3: the arguments schema must have type 'object'"]
    # ...and the next large request has a new process.
    assert problems("third") == ["3: the arguments schema must have type 'object'"]
    assert offload._process is not None and offload._process is not process
