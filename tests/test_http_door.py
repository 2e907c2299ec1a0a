"""The HTTP/SSE door as a raw HTTP client sees it: the same edge as the gRPC door (credentials,
tenancy across the doors), the extension events only when asked for, the controls, and bad input
— malformed JSON, wrong types, unknown item types, an oversized body, headers dribbled, a client
gone mid-stream — each a spec error or a clean close, the gateway healthy afterwards and the
response stored with its final status."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from antwort_grpc import pb
from antwort_grpc.http.door import DoorSettings
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.providers.scripted import Call, ScriptedProvider, Text
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply, ScriptedToolCall
from tests.auth_fixtures import api_keys
from tests.http_harness import Doors, assert_event_schema, assert_schema, running_doors, sse_events

MODEL = "test-model"


def answering(text: str = "Fine, thanks.") -> ScriptedProvider:
    return ScriptedProvider([[Text(text)]], repeat=True)


async def post(doors: Doors, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(doors.url + "/v1/responses", json=body, headers=headers) as response,
    ):
        return response.status, await response.json()


async def healthy(doors: Doors) -> None:
    """The gateway still answers, on both doors."""
    status, body = await post(doors, {"model": MODEL, "input": "still there?"})
    assert status == 200 and body["status"] == "completed", body
    assert_schema(body)
    assert (await doors.grpc.create(pb.CreateResponseRequest(input_text="and here?"))).status == (
        pb.ResponseStatus.RESPONSE_STATUS_COMPLETED
    )


def assert_error(status: int, body: Any, expected: int, param: str | None) -> None:
    assert status == expected, body
    assert set(body) == {"error"}, body
    assert_schema(body["error"], "ErrorPayload")
    assert body["error"]["param"] == param, body


# ------------------------------------------------------------------------------- bad input


async def test_malformed_json_is_a_400_naming_the_body_and_the_gateway_goes_on() -> None:
    async with running_doors(provider=answering()) as doors:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                doors.url + "/v1/responses",
                data=b'{"model": "m", "input": ',
                headers={"Content-Type": "application/json"},
            ) as response,
        ):
            status, body = response.status, await response.json()
        assert_error(status, body, 400, "body")
        await healthy(doors)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([1, 2], "body"),
        ({"model": 7, "input": "hi"}, "model"),
        ({"model": MODEL, "input": 42}, "input"),
        ({"model": MODEL, "input": "hi", "stream": "yes"}, "stream"),
        ({"model": MODEL, "input": "hi", "max_output_tokens": 1.5}, "max_output_tokens"),
        ({"model": MODEL, "input": "hi", "metadata": {"k": 1}}, "metadata.k"),
        ({"model": MODEL, "input": [{"type": "message", "role": "user", "content": 3}]}, "input[0].content"),
        (
            {"model": MODEL, "input": [{"type": "message", "role": "user", "content": [{"type": "x"}]}]},
            "input[0].content[0].type",
        ),
        ({"model": MODEL, "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
        ({"model": MODEL, "input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"model": MODEL, "input": "hi", "tool_choice": "sometimes"}, "tool_choice"),
        ({"model": MODEL, "input": "hi", "no_such_parameter": 1}, "no_such_parameter"),
        ({"model": MODEL, "input": "hi", "text": {"format": {"type": "json_schema"}}}, "text.format.name"),
        ({"model": MODEL, "input": "hi", "text": {"format": {"type": "xml"}}}, "text.format.type"),
    ],
)
async def test_a_value_of_the_wrong_type_or_kind_is_a_400_naming_its_parameter(body: Any, param: str) -> None:
    async with running_doors(provider=answering()) as doors:
        status, answer = await post(doors, body)
        assert_error(status, answer, 400, param)


async def test_an_unknown_item_type_is_a_400_and_nothing_is_stored() -> None:
    store = MemoryStore()
    async with running_doors(provider=answering(), store=store) as doors:
        status, body = await post(doors, {"model": MODEL, "input": [{"type": "telepathy", "thought": "hi"}]})
        assert_error(status, body, 400, "input[0].type")
        assert "telepathy" in body["error"]["message"]
        assert not store._entries
        await healthy(doors)


async def test_core_validation_names_the_json_parameter_not_the_protobuf_field() -> None:
    async with running_doors(provider=answering()) as doors:
        status, body = await post(
            doors, {"model": MODEL, "input": [{"type": "function_call_output", "call_id": "", "output": "x"}]}
        )
        assert_error(status, body, 400, "input[0].call_id")
        status, body = await post(
            doors, {"model": MODEL, "input": "hi", "tools": [{"type": "function", "name": "a b"}]}
        )
        assert_error(status, body, 400, "tools[0].name")


async def test_an_oversized_body_is_a_413_in_the_spec_error_shape() -> None:
    async with running_doors(DoorSettings(max_body_bytes=4096), provider=answering()) as doors:
        status, body = await post(doors, {"model": MODEL, "input": "x" * 10_000})
        assert status == 413, body
        assert_schema(body["error"], "ErrorPayload")
        assert "ANTWORT_HTTP_MAX_BODY_BYTES" in body["error"]["message"]
        await healthy(doors)


async def test_a_client_that_dribbles_its_headers_is_closed_and_the_gateway_goes_on() -> None:
    async with running_doors(DoorSettings(idle_timeout=0.5), provider=answering()) as doors:
        reader, writer = await asyncio.open_connection(doors.door.host, doors.door.port)
        writer.write(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\n")
        await writer.drain()
        closed = asyncio.create_task(reader.read())
        # Keeps sending a header byte now and then, never the end of the headers.
        for _ in range(200):
            writer.write(b"X")
            try:
                await asyncio.wait_for(asyncio.shield(closed), 0.1)
                break
            except TimeoutError:
                continue
        assert closed.done() and await closed == b"", "the connection was never closed"
        writer.close()
        await healthy(doors)


async def test_a_client_that_goes_away_mid_stream_cancels_the_run_which_is_stored_cancelled() -> None:
    async with FakeOpenAI(Reply(text="never all of it", hold_at=2)) as fake:
        provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model=MODEL))
        try:
            async with running_doors(provider=provider, store=MemoryStore(), model=MODEL) as doors:
                async with aiohttp.ClientSession() as session:
                    response = await session.post(
                        doors.url + "/v1/responses", json={"model": MODEL, "input": "hi", "stream": True}
                    )
                    first = await response.content.readline()
                    data = await response.content.readline()
                    assert first.startswith(b"event: response.created")
                    response_id = json.loads(data[len(b"data: ") :])["response"]["id"]
                    await fake.wait_held()
                    response.close()  # the client goes away
                await fake.wait_for_disconnect()
                assert await doors.grpc.gateway.engine.runs.wait_idle(10.0)
                stored = await doors.grpc.store.get(response_id)
                assert stored is not None
                assert stored.response.status == pb.ResponseStatus.RESPONSE_STATUS_CANCELLED
                fake.release()
        finally:
            await provider.aclose()


async def test_a_client_that_goes_away_before_a_non_streamed_answer_cancels_the_run() -> None:
    async with FakeOpenAI(Reply(text="never", first_delay=30)) as fake:
        provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model=MODEL))
        try:
            async with running_doors(provider=provider, store=MemoryStore(), model=MODEL) as doors:
                async with aiohttp.ClientSession() as session:
                    request = asyncio.create_task(
                        session.post(doors.url + "/v1/responses", json={"model": MODEL, "input": "hi"})
                    )
                    await fake.wait_for_requests(1)  # the run is waiting for its model
                    (response_id,) = doors.grpc.gateway.engine.runs.running()
                    request.cancel()
                await fake.wait_for_disconnect()
                assert await doors.grpc.gateway.engine.runs.wait_idle(10.0)
                stored = await doors.grpc.store.get(response_id)
                assert stored is not None
                assert stored.response.status == pb.ResponseStatus.RESPONSE_STATUS_CANCELLED
        finally:
            await provider.aclose()


# ----------------------------------------------------------------------- the same edge


async def test_credentials_and_tenancy_are_the_gateways_on_both_doors(tmp_path: Path) -> None:
    credentials = api_keys(tmp_path)
    async with running_doors(provider=answering(), **credentials.settings) as doors:
        status, body = await post(doors, {"model": MODEL, "input": "hi"})
        assert_error(status, body, 401, None)
        status, body = await post(doors, {"model": MODEL, "input": "hi"}, {"Authorization": "Bearer wrong"})
        assert_error(status, body, 401, None)
        # Created over gRPC by alice: her tenant reads it over HTTP, bob's gets 404.
        created = await doors.grpc.stub.CreateResponse(
            pb.CreateResponseRequest(input_text="from grpc"), metadata=credentials.of("alice")
        ).read()
        response_id = created.event.completed.response.id
        async with aiohttp.ClientSession() as session:
            for who, expected in (("alice", 200), ("carol", 200), ("bob", 404)):
                headers = {"Authorization": f"Bearer {credentials.tokens[who]}"}
                async with session.get(f"{doors.url}/v1/responses/{response_id}", headers=headers) as response:
                    assert response.status == expected, (who, await response.text())
        # Created over HTTP by bob: not alice's over gRPC.
        status, body = await post(
            doors, {"model": MODEL, "input": "hi"}, {"Authorization": f"Bearer {credentials.tokens['bob']}"}
        )
        assert status == 200
        with pytest.raises(Exception, match="NOT_FOUND"):
            await doors.grpc.stub.GetResponse(
                pb.GetResponseRequest(response_id=body["id"]), metadata=credentials.of("alice")
            )


async def test_the_per_caller_limit_is_shared_by_the_two_doors() -> None:
    async with FakeOpenAI(Reply(text="held", hold_at=1)) as fake:
        provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model=MODEL))
        try:
            async with running_doors(
                provider=provider, store=MemoryStore(), model=MODEL, max_concurrent_responses=1
            ) as doors:
                call = doors.grpc.stub.CreateResponse(pb.CreateResponseRequest(input_text="hold", stream=True))
                await call.read()
                await fake.wait_held()
                status, body = await post(doors, {"model": MODEL, "input": "one more"})
                assert_error(status, body, 429, None)
                assert body["error"]["code"] == "too_many_responses"
                fake.release()
                while await call.read() != grpc.aio.EOF:
                    pass
        finally:
            await provider.aclose()


# ------------------------------------------------------------------ extensions, controls


def tool_turns() -> ScriptedProvider:
    return ScriptedProvider([[Call.of("lookup", {"q": "x"})], [Text("Done.")]])


LOOKUP = {
    "type": "function",
    "name": "lookup",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
}


async def test_our_events_reach_only_a_client_that_asks_for_them() -> None:
    from tests.fakes import MockExecutor, echo

    body = {"model": MODEL, "input": "look it up", "tools": [LOOKUP], "stream": True}
    async with aiohttp.ClientSession() as session:
        for extended in (False, True):
            executor = MockExecutor({"lookup": echo})
            async with running_doors(provider=tool_turns(), executors=[executor]) as doors:
                headers = {"Antwort-Events": "all"} if extended else {}
                async with session.post(doors.url + "/v1/responses", json=body, headers=headers) as response:
                    events = await sse_events(response)
            ours = [e["type"] for e in events if e["type"].startswith("antwort:")]
            if extended:
                assert "antwort:turn_started" in ours and "antwort:tool_execution_completed" in ours, ours
            else:
                assert ours == []
                for event in events:
                    assert_event_schema(event)
            assert events[-1]["type"] == "response.completed"
            # Contiguous in what this client sees, whichever events it asked for.
            assert [e["sequence_number"] for e in events] == list(range(1, len(events) + 1))


async def test_a_response_is_paused_resumed_and_steered_over_http() -> None:
    from tests.fakes import MockExecutor, echo

    lookup = ScriptedToolCall(name="lookup", arguments='{"q": "x"}')
    # The model's first turn is held until the pause has been sent: it takes effect before the
    # tool call starts.
    async with FakeOpenAI(Reply(tool_calls=[lookup], hold_at=1), Reply(text="Resumed answer.")) as fake:
        provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model=MODEL))
        executor = MockExecutor({"lookup": echo})
        try:
            async with (
                running_doors(provider=provider, executors=[executor], model=MODEL) as doors,
                aiohttp.ClientSession() as session,
            ):
                body = {"model": MODEL, "input": "go", "tools": [LOOKUP], "stream": True}
                headers = {"Antwort-Events": "all"}
                async with session.post(doors.url + "/v1/responses", json=body, headers=headers) as response:
                    events = [await _next_event(response)]
                    response_id = events[0]["response"]["id"]
                    await fake.wait_held()
                    url = f"{doors.url}/v1/responses/{response_id}"
                    async with session.post(f"{url}/pause", json={"reason": "hold on"}) as r:
                        assert r.status == 200, await r.text()
                        # A small acknowledgement, not the response.
                        ack = await r.json()
                        assert ack["id"] == response_id and ack["object"] == "response.control"
                        assert ack["status"] == "in_progress" and ack["sequence_number"] >= 1
                    fake.release()
                    while events[-1]["type"] != "antwort:paused":
                        events.append(await _next_event(response))
                    assert executor.calls == []
                    async with session.post(f"{url}/resume") as r:
                        assert r.status == 200, await r.text()
                    events += await sse_events(response)
                types = [e["type"] for e in events]
                assert "antwort:resumed" in types and types[-1] == "response.completed", types
                assert len(executor.calls) == 1
                async with session.post(f"{url}/steer", json={"input": "late"}) as r:
                    assert r.status == 409
                    assert (await r.json())["error"]["code"] == "not_in_progress"
                async with session.post(f"{url}/steer", json={"input": 5}) as r:
                    assert r.status == 400 and (await r.json())["error"]["param"] == "input"
        finally:
            await provider.aclose()


async def _next_event(response: aiohttp.ClientResponse) -> dict[str, Any]:
    while True:
        line = (await response.content.readline()).decode()
        if line.startswith("data: ") and line.strip() != "data: [DONE]":
            event: dict[str, Any] = json.loads(line[len("data: ") :])
            return event


async def test_a_tool_that_needs_approval_is_approved_with_openais_approval_items() -> None:
    from tests.fakes import MockExecutor, echo

    provider = ScriptedProvider([[Call.of("lookup", {"q": "x"})], [Text("Approved and done.")]])
    executor = MockExecutor({"lookup": echo})
    tool = {**LOOKUP, "require_approval": "always"}
    async with running_doors(provider=provider, executors=[executor]) as doors:
        status, first = await post(doors, {"model": MODEL, "input": "go", "tools": [tool]})
        assert status == 200 and first["status"] == "completed"
        requests = [item for item in first["output"] if item["type"] == "mcp_approval_request"]
        assert [(r["name"], r["arguments"]) for r in requests] == [("lookup", '{"q": "x"}')]
        assert executor.calls == []
        answer = {"type": "mcp_approval_response", "approval_request_id": requests[0]["id"], "approve": True}
        status, second = await post(
            doors, {"model": MODEL, "previous_response_id": first["id"], "tools": [tool], "input": [answer]}
        )
    assert status == 200 and second["status"] == "completed", second
    assert len(executor.calls) == 1
    assert second["output"][0]["type"] == "function_call_output"
    assert second["output"][-1]["content"][0]["text"] == "Approved and done."
    assert_schema(second)


async def test_a_call_waiting_on_a_grpc_session_is_approved_and_a_follow_up_queued_over_http() -> None:
    from tests.fakes import MockExecutor, echo

    provider = ScriptedProvider(
        [[Call.of("lookup", {"q": "x"})], [Text("Looked it up.")], [Text("And the follow-up.")]]
    )
    executor = MockExecutor({"lookup": echo})
    tool = pb.Tool(
        function=pb.FunctionTool(name="lookup"),
        require_approval=pb.RequireApproval(mode=pb.ApprovalMode.APPROVAL_MODE_ALWAYS),
    )
    async with running_doors(provider=provider, executors=[executor]) as doors, aiohttp.ClientSession() as session:
        call = doors.grpc.stub.Converse()
        await call.write(pb.ConverseRequest(create=pb.CreateResponseRequest(input_text="go", tools=[tool])))
        events: list[pb.StreamEvent] = []
        while not events or events[-1].WhichOneof("event") != "approval_requested":
            events.append((await call.read()).event)
        response_id = events[0].created.response.id
        (waiting,) = events[-1].approval_requested.requests
        url = f"{doors.url}/v1/responses/{response_id}"
        async with session.post(f"{url}/follow_up", json={"input": "one more thing"}) as r:
            assert r.status == 200, await r.text()
        decision = {"approval_request_id": waiting.call_id, "approve": True, "reason": "fine"}
        async with session.post(f"{url}/approval", json=decision) as r:
            assert r.status == 200, await r.text()
            # Its output holds OpenAI's mcp_approval_request item, which the spec lacks (docs/http.md).
            assert (await r.json())["id"] == response_id
        while events[-1].WhichOneof("event") not in ("completed", "failed", "incomplete", "cancelled"):
            events.append((await call.read()).event)
        await call.done_writing()
    assert events[-1].WhichOneof("event") == "completed"
    assert len(executor.calls) == 1
    texts = [e.output_text_done.text for e in events if e.WhichOneof("event") == "output_text_done"]
    assert texts == ["Looked it up.", "And the follow-up."]
