"""Every response that started is stored with its final status, on every path, through a real
gateway on a loopback port, with each store (memory, a SQLite file, a PostgreSQL database)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from antwort_grpc import pb
from antwort_grpc.providers.base import ProviderError
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text, Turn
from antwort_grpc.storage.base import StoredResponse
from antwort_grpc.storage.memory import MemoryStore
from tests.fakes import MockExecutor, echo
from tests.harness import (
    assert_valid_stream,
    final,
    function_tool,
    kinds,
    output_kinds,
    output_text,
    running_gateway,
    user,
)
from tests.storage.conftest import Backend

S = pb.ResponseStatus
STREAM = pytest.mark.parametrize("stream", [True, False], ids=["streaming", "unary"])


def weather() -> pb.CreateResponseRequest:
    request = user("Weather in Paris?")
    request.tools.append(function_tool("get_weather", city="string"))
    return request


def follow_up(previous: str, *items: pb.Item) -> pb.CreateResponseRequest:
    request = pb.CreateResponseRequest(previous_response_id=previous)
    request.input_items.items.extend(items)
    request.tools.append(function_tool("get_weather", city="string"))
    return request


def answer(call_id: str, output: str) -> pb.Item:
    return pb.Item(function_call_output=pb.FunctionCallOutput(call_id=call_id, output=output))


async def run(gw: Any, request: pb.CreateResponseRequest, stream: bool) -> pb.Response:
    if stream:
        return final(await gw.stream(request))
    response: pb.Response = await gw.create(request)
    return response


async def stored(store: Any, response_id: str) -> pb.Response:
    record = await store.get(response_id)
    assert record is not None, f"{response_id} was not stored"
    response: pb.Response = record.response
    return response


@STREAM
async def test_a_completed_response_is_stored_with_its_input(store: Any, stream: bool) -> None:
    provider = ScriptedProvider([[Text("Hello there.")]])
    async with running_gateway(provider=provider, store=store) as gw:
        response = await run(gw, user("hi"), stream)
    saved = await stored(store, response.id)
    assert saved == response
    assert saved.status == S.RESPONSE_STATUS_COMPLETED and output_text(saved) == "Hello there."
    record = await store.get(response.id)
    assert [p.input_text.text for i in record.input_items for p in i.message.content] == ["hi"]


@STREAM
async def test_requires_action_is_stored_and_continued_after_the_gateway_restarts(
    backend: Backend, stream: bool
) -> None:
    first_store = await backend.open()
    provider = ScriptedProvider([[Call.of("get_weather", {"city": "Paris"}, call_id="c1")], [Text("Sunny, 21°C.")]])
    async with running_gateway(provider=provider, store=first_store) as gw:
        paused = await run(gw, weather(), stream)
    assert paused.status == S.RESPONSE_STATUS_REQUIRES_ACTION
    assert (await stored(first_store, paused.id)) == paused
    await backend.close(first_store)

    # A new process: a new store on the same database, a new gateway.
    second_store = await backend.open()
    async with running_gateway(provider=provider, store=second_store) as gw:
        done = await run(gw, follow_up(paused.id, answer("c1", '{"temp": 21}')), stream)
    assert done.status == S.RESPONSE_STATUS_COMPLETED and output_text(done) == "Sunny, 21°C."
    sent = provider.requests[1].items
    assert [i.WhichOneof("kind") for i in sent] == ["message", "function_call", "function_call_output"]
    assert sent[1].function_call.call_id == sent[2].function_call_output.call_id == "c1"
    assert (await stored(second_store, done.id)).previous_response_id == paused.id


async def test_an_approval_is_given_after_the_gateway_restarts(backend: Backend) -> None:
    first_store = await backend.open()
    provider = ScriptedProvider([[Call.of("get_weather", {"city": "Paris"}, call_id="c1")], [Text("Sunny.")]])
    tool = function_tool("get_weather", city="string")
    tool.require_approval.mode = pb.ApprovalMode.APPROVAL_MODE_ALWAYS
    request = user("Weather in Paris?")
    request.tools.append(tool)
    async with running_gateway(provider=provider, store=first_store) as gw:
        paused = await gw.create(request)
    assert paused.status == S.RESPONSE_STATUS_REQUIRES_ACTION
    await backend.close(first_store)

    second_store = await backend.open()
    async with running_gateway(provider=provider, store=second_store) as gw:
        approve = pb.CreateResponseRequest(previous_response_id=paused.id, tools=[tool])
        approve.input_items.items.add().approval_response.CopyFrom(pb.ApprovalResponse(call_id="c1", approve=True))
        handed = await gw.create(approve)
        # The approved call is handed out to run: last in the output, as OpenAI answers.
        assert [i.WhichOneof("kind") for i in handed.output] == ["function_call"]
        assert handed.output[-1].function_call.call_id == "c1"
        assert handed.status == S.RESPONSE_STATUS_REQUIRES_ACTION
        done = await gw.create(follow_up(handed.id, answer("c1", '{"temp": 21}')))
    assert done.status == S.RESPONSE_STATUS_COMPLETED and output_text(done) == "Sunny."


@STREAM
async def test_the_turn_limit_stores_an_incomplete_response(store: Any, stream: bool) -> None:
    provider = ScriptedProvider([[Call.of("A", {})]], repeat=True)
    request = user("loop")
    request.tools.append(function_tool("A"))
    async with running_gateway(
        provider=provider, store=store, executors=[MockExecutor({"A": echo})], max_turns=2
    ) as gw:
        response = await run(gw, request, stream)
    saved = await stored(store, response.id)
    assert saved.status == S.RESPONSE_STATUS_INCOMPLETE and saved.incomplete_details.reason == "max_turns"
    assert output_kinds(saved) == ["function_call", "function_call_output"] * 2


@STREAM
async def test_a_failure_after_a_tool_turn_stores_failed_with_the_work_done(store: Any, stream: bool) -> None:
    provider = ScriptedProvider([[Call.of("A", {})], Turn(error=ProviderError("backend_unavailable", "down"))])
    request = user("use A")
    request.tools.append(function_tool("A"))
    async with running_gateway(provider=provider, store=store, executors=[MockExecutor({"A": echo})]) as gw:
        response = await run(gw, request, stream)
    saved = await stored(store, response.id)
    assert saved.status == S.RESPONSE_STATUS_FAILED and saved.error.code == "backend_unavailable"
    assert output_kinds(saved) == ["function_call", "function_call_output"]


async def test_a_failure_mid_stream_stores_failed_with_the_partial_text(store: Any) -> None:
    provider = ScriptedProvider(
        [Turn([Text("partial answer that breaks")], error=ProviderError("backend_unavailable", "cut"), error_after=2)]
    )
    async with running_gateway(provider=provider, store=store) as gw:
        response = final(await gw.stream(user("hi")))
    saved = await stored(store, response.id)
    assert saved.status == S.RESPONSE_STATUS_FAILED
    assert saved.output[0].status == pb.ItemStatus.ITEM_STATUS_INCOMPLETE
    assert output_text(saved) == "partial answer"


async def test_the_response_is_stored_in_progress_before_the_client_sees_its_id(store: Any) -> None:
    provider = ScriptedProvider([Turn([Text("slow " * 20)], delay=0.01)])
    async with running_gateway(provider=provider, store=store) as gw:
        request = user("talk")
        request.stream = True
        call = gw.stub.CreateResponse(request)
        created = (await call.read()).event
        response_id = created.created.response.id
        running = await stored(store, response_id)
        assert running.status == S.RESPONSE_STATUS_IN_PROGRESS
        got = await gw.stub.GetResponse(pb.GetResponseRequest(response_id=response_id))
        assert got.response.status == S.RESPONSE_STATUS_IN_PROGRESS
        events = [created]
        while (message := await call.read()) != grpc.aio.EOF:
            events.append(message.event)
    assert_valid_stream(events)
    assert (await stored(store, response_id)).status == S.RESPONSE_STATUS_COMPLETED


async def test_cancel_mid_stream_stores_cancelled_with_the_partial_output(store: Any) -> None:
    provider = ScriptedProvider([Turn([Text("word " * 200)], delay=0.01)])
    async with running_gateway(provider=provider, store=store) as gw:
        request = user("talk slowly")
        request.stream = True
        events: list[pb.StreamEvent] = []
        async for message in gw.stub.CreateResponse(request):
            events.append(message.event)
            if kinds(events).count("output_text_delta") == 3:
                response_id = events[0].created.response.id
                reply = await gw.stub.CancelResponse(pb.CancelResponseRequest(response_id=response_id))
                assert reply.response.status == S.RESPONSE_STATUS_CANCELLED
    assert_valid_stream(events)
    assert kinds(events)[-1] == "cancelled"
    saved = await stored(store, response_id)
    assert saved.status == S.RESPONSE_STATUS_CANCELLED
    assert saved.output[0].status == pb.ItemStatus.ITEM_STATUS_INCOMPLETE
    assert output_text(saved).startswith("word word word")


async def test_tool_results_are_stored_before_the_next_model_call(store: Any) -> None:
    """A crash in a later turn loses no tool work: the running response already holds it."""
    tools = MockExecutor({"lookup": echo})
    provider = ScriptedProvider([[Call.of("lookup", {"q": "x"})], Turn([Text("slow answer " * 50)], delay=0.02)])
    async with running_gateway(provider=provider, store=store, executors=[tools]) as gw:
        request = user("look it up")
        request.tools.append(function_tool("lookup", q="string"))
        request.stream = True
        events: list[pb.StreamEvent] = []
        running: pb.Response | None = None
        async for message in gw.stub.CreateResponse(request):
            events.append(message.event)
            # The first delta only: deltas already on their way still arrive after the cancel.
            if kinds(events)[-1] == "output_text_delta" and running is None:
                response_id = events[0].created.response.id
                running = await stored(store, response_id)
                await gw.stub.CancelResponse(pb.CancelResponseRequest(response_id=response_id))
    assert running is not None
    assert running.status == S.RESPONSE_STATUS_IN_PROGRESS
    assert output_kinds(running) == ["function_call", "function_call_output"]
    assert running.output[1].function_call_output.output == echo(running.output[0].function_call)
    assert kinds(events)[-1] == "cancelled"


async def test_a_client_that_goes_away_leaves_a_cancelled_response(store: Any) -> None:
    provider = ScriptedProvider([Turn([Text("word " * 200)], delay=0.01)])
    async with running_gateway(provider=provider, store=store) as gw:
        request = user("talk")
        request.stream = True
        call = gw.stub.CreateResponse(request)
        response_id = (await call.read()).event.created.response.id
        await call.read()
        handle = gw.gateway.engine.runs.get(response_id)
        assert handle is not None
        call.cancel()
        await handle.done.wait()
    assert (await stored(store, response_id)).status == S.RESPONSE_STATUS_CANCELLED


@STREAM
async def test_store_false_keeps_nothing_and_cannot_be_continued(store: Any, stream: bool) -> None:
    provider = ScriptedProvider([[Call.of("get_weather", {"city": "Paris"}, call_id="c1")]])
    async with running_gateway(provider=provider, store=store) as gw:
        request = weather()
        request.store = False
        paused = await run(gw, request, stream)
        assert paused.status == S.RESPONSE_STATUS_REQUIRES_ACTION and not paused.store
        assert await store.get(paused.id) is None
        for rpc in (
            gw.stub.GetResponse(pb.GetResponseRequest(response_id=paused.id)),
            gw.stub.ListInputItems(pb.ListInputItemsRequest(response_id=paused.id)),
            gw.stub.CreateResponse(follow_up(paused.id, answer("c1", "x"))),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await _finish(rpc)
            assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_get_list_input_items_and_delete_over_grpc(store: Any) -> None:
    provider = ScriptedProvider([[Text("ok")]])
    request = pb.CreateResponseRequest()
    for n in range(5):
        request.input_items.items.append(
            pb.Item(
                id=f"in_{n}",
                message=pb.Message(
                    role=pb.Role.ROLE_USER, content=[pb.ContentPart(input_text=pb.InputText(text=f"m{n}"))]
                ),
            )
        )
    async with running_gateway(provider=provider, store=store) as gw:
        response = await gw.create(request)
        got = await gw.stub.GetResponse(pb.GetResponseRequest(response_id=response.id))
        assert got.response == response
        page = await gw.stub.ListInputItems(pb.ListInputItemsRequest(response_id=response.id, limit=2))
        assert [i.id for i in page.items] == ["in_0", "in_1"] and page.has_more
        assert (page.first_id, page.last_id) == ("in_0", "in_1")
        page = await gw.stub.ListInputItems(
            pb.ListInputItemsRequest(response_id=response.id, limit=2, after=page.last_id)
        )
        assert [i.id for i in page.items] == ["in_2", "in_3"] and page.has_more
        page = await gw.stub.ListInputItems(
            pb.ListInputItemsRequest(response_id=response.id, limit=10, order=pb.ListOrder.LIST_ORDER_DESC)
        )
        assert [i.id for i in page.items] == [f"in_{n}" for n in (4, 3, 2, 1, 0)] and not page.has_more
        deleted = await gw.stub.DeleteResponse(pb.DeleteResponseRequest(response_id=response.id))
        assert deleted.deleted and deleted.response_id == response.id
        for rpc in (
            gw.stub.GetResponse(pb.GetResponseRequest(response_id=response.id)),
            gw.stub.DeleteResponse(pb.DeleteResponseRequest(response_id=response.id)),
            gw.stub.ListInputItems(pb.ListInputItemsRequest(response_id=response.id)),
            gw.stub.CreateResponse(pb.CreateResponseRequest(previous_response_id=response.id, input_text="more")),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await _finish(rpc)
            assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_cancelling_an_ended_response_is_refused_and_an_unknown_one_is_not_found(store: Any) -> None:
    provider = ScriptedProvider([[Text("done")]])
    async with running_gateway(provider=provider, store=store) as gw:
        response = await gw.create(user("hi"))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await gw.stub.CancelResponse(pb.CancelResponseRequest(response_id=response.id))
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await gw.stub.CancelResponse(pb.CancelResponseRequest(response_id="resp_unknown"))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert (await stored(store, response.id)).status == S.RESPONSE_STATUS_COMPLETED


async def _finish(call: Any) -> None:
    """Await a unary call or drain a streaming one."""
    if hasattr(call, "read"):
        async for _ in call:
            pass
    else:
        await call


class StoreThatGoesDown(MemoryStore):
    down = False

    async def save(self, record: StoredResponse) -> None:
        if self.down:
            raise ConnectionError("the database went away")
        await super().save(record)


@STREAM
async def test_a_response_is_refused_while_its_store_is_down_rather_than_run_unrecorded(stream: bool) -> None:
    store = StoreThatGoesDown()
    store.down = True
    provider = ScriptedProvider([[Text("fine")]], repeat=True)
    async with running_gateway(provider=provider, store=store) as gw:
        request = user("hi")
        request.stream = stream
        call = gw.stub.CreateResponse(request)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _finish(call)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "store is unavailable" in (info.value.details() or "")
        assert provider.requests == [], "the model was never called"
        assert gw.gateway.engine.runs.running() == []

        unstored = user("nothing to keep")
        unstored.store = False
        assert (await run(gw, unstored, stream)).status == S.RESPONSE_STATUS_COMPLETED
        store.down = False
        assert (await run(gw, user("hi again"), stream)).status == S.RESPONSE_STATUS_COMPLETED
