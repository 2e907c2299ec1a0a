"""Item references over both doors, against a real gateway on the fake OpenAI-compatible backend:
an `item_reference` input item (the AI SDK's multi-turn chat sends earlier assistant messages so)
is replaced by the stored item it names before the response starts — the model sees the item,
the response's input items hold it. Another owner's item is NOT_FOUND exactly as an id that
exists nowhere, and the error names the field."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from antwort_grpc import pb
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply
from tests.auth_fixtures import Credentials, api_keys
from tests.http_harness import Doors, assert_schema, running_doors

MODEL = "fake-model"
S = pb.ResponseStatus


@asynccontextmanager
async def doors(*replies: Reply, **settings: Any) -> AsyncIterator[tuple[Doors, FakeOpenAI]]:
    async with FakeOpenAI(*replies) as fake:
        provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model=MODEL))
        try:
            async with running_doors(provider=provider, store=MemoryStore(), model=MODEL, **settings) as running:
                yield running, fake
        finally:
            await provider.aclose()


async def call(running: Doors, method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, running.url + path, json=body, headers=headers) as response,
    ):
        return response.status, await response.json()


async def test_an_earlier_answer_referenced_by_id_is_what_the_model_sees_and_what_the_input_holds() -> None:
    async with doors(Reply(text="Paris is the capital."), Reply(text="About two million.")) as (running, fake):
        status, first = await call(running, "POST", "/v1/responses", {"model": MODEL, "input": "Capital of France?"})
        assert status == 200, first
        answer = first["output"][0]
        # The AI SDK's multi-turn shape: the user's turns as messages, the assistant's by reference.
        body = {
            "model": MODEL,
            "input": [
                {"role": "user", "content": "Capital of France?"},
                {"type": "item_reference", "id": answer["id"]},
                {"role": "user", "content": "How many people live there?"},
            ],
        }
        status, second = await call(running, "POST", "/v1/responses", body)
        assert status == 200 and second["status"] == "completed", second
        assert_schema(second)
        sent = fake.chat_requests[-1]["messages"]
        assert [(m["role"], m["content"]) for m in sent] == [
            ("user", "Capital of France?"),
            ("assistant", "Paris is the capital."),
            ("user", "How many people live there?"),
        ]
        status, listed = await call(running, "GET", f"/v1/responses/{second['id']}/input_items")
        assert status == 200
        assert listed["data"][1] == answer  # the item itself, not the reference


async def test_a_reference_without_a_type_and_one_to_an_input_item_over_grpc() -> None:
    async with doors(Reply(text="Noted."), Reply(text="Blue."), Reply(text="Still blue.")) as (running, fake):
        first = await running.grpc.create(pb.CreateResponseRequest(input_text="My favourite colour is blue."))
        stated = (await running.grpc.store.get(first.id)).input_items[0]  # type: ignore[union-attr]
        # The spec's ItemReferenceParam lets `type` out: {"id": ...}.
        status, body = await call(
            running,
            "POST",
            "/v1/responses",
            {"model": MODEL, "input": [{"id": stated.id}, {"role": "user", "content": "Which colour?"}]},
        )
        assert status == 200 and body["status"] == "completed", body
        assert fake.chat_requests[-1]["messages"][0] == {"role": "user", "content": "My favourite colour is blue."}
        reference = pb.Item(item_reference=pb.ItemReference(id=first.output[0].id))
        question = pb.Item(
            message=pb.Message(role=pb.Role.ROLE_USER, content=[pb.ContentPart(input_text=pb.InputText(text="Sure?"))])
        )
        again = await running.grpc.create(
            pb.CreateResponseRequest(input_items=pb.ItemList(items=[reference, question]))
        )
        assert again.status == S.RESPONSE_STATUS_COMPLETED
        assert fake.chat_requests[-1]["messages"][0] == {"role": "assistant", "content": "Noted."}
        listed = await running.grpc.stub.ListInputItems(pb.ListInputItemsRequest(response_id=again.id))
        assert listed.items[0] == first.output[0]


async def test_an_unknown_id_is_not_found_naming_the_field_and_nothing_starts() -> None:
    async with doors(Reply(text="unused")) as (running, fake):
        body = {
            "model": MODEL,
            "input": [
                {"role": "user", "content": "a"},
                {"role": "user", "content": "b"},
                {"role": "user", "content": "c"},
                {"type": "item_reference", "id": "msg_nowhere"},
            ],
        }
        status, error = await call(running, "POST", "/v1/responses", body)
        assert status == 404, error
        assert error["error"]["param"] == "input[3].id" and error["error"]["code"] == "not_found"
        assert "msg_nowhere" in error["error"]["message"]
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await running.grpc.create(
                pb.CreateResponseRequest(
                    input_items=pb.ItemList(items=[pb.Item(item_reference=pb.ItemReference(id="msg_nowhere"))])
                )
            )
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND
        assert _violations(raised.value) == ["input_items.items[0].item_reference.id"]
        assert not fake.chat_requests
        assert not running.grpc.store._entries  # type: ignore[attr-defined]


async def test_another_owners_item_is_not_found_exactly_as_if_it_did_not_exist(tmp_path: Path) -> None:
    credentials = api_keys(tmp_path)
    async with doors(Reply(text="alice's secret answer"), **credentials.settings) as (running, fake):
        status, mine = await call(
            running, "POST", "/v1/responses", {"model": MODEL, "input": "hi"}, credentials.tokens["alice"]
        )
        assert status == 200, mine
        theirs = mine["output"][0]["id"]
        answers = [await _refer(running, credentials, "bob", item_id) for item_id in (theirs, "msg_000000000000")]
        # The same status, code and parameter; only the id named differs.
        (status, found), (missing_status, missing) = answers
        assert status == missing_status == 404
        assert found["error"]["message"].replace(theirs, "ID") == missing["error"]["message"].replace(
            "msg_000000000000", "ID"
        )
        assert {k: v for k, v in found["error"].items() if k != "message"} == {
            k: v for k, v in missing["error"].items() if k != "message"
        }
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await running.grpc.stub.CreateResponse(
                pb.CreateResponseRequest(
                    input_items=pb.ItemList(items=[pb.Item(item_reference=pb.ItemReference(id=theirs))])
                ),
                metadata=credentials.of("bob"),
            ).read()
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND
        assert "secret" not in (raised.value.details() or "")
        assert len(fake.chat_requests) == 1


async def _refer(running: Doors, credentials: Credentials, who: str, item_id: str) -> tuple[int, Any]:
    body = {"model": MODEL, "input": [{"type": "item_reference", "id": item_id}]}
    return await call(running, "POST", "/v1/responses", body, credentials.tokens[who])


async def test_a_reference_without_an_id_is_invalid_and_a_control_cannot_carry_one() -> None:
    async with doors() as (running, _):
        status, error = await call(
            running, "POST", "/v1/responses", {"model": MODEL, "input": [{"type": "item_reference", "id": ""}]}
        )
        assert status == 400 and error["error"]["param"] == "input[0].id", error
    from antwort_grpc.responses.controls import validate_control

    control = pb.Control(steer=pb.SteerControl(items=[pb.Item(item_reference=pb.ItemReference(id="msg_1"))]))
    assert [v.field for v in validate_control(control)] == ["control.steer.items[0]"]


def _violations(error: grpc.aio.AioRpcError) -> list[str]:
    status = rpc_status.from_call(error)
    assert status is not None
    fields: list[str] = []
    for detail in status.details:
        request = error_details_pb2.BadRequest()
        if detail.Unpack(request):
            fields += [v.field for v in request.field_violations]
    return fields


def _user(text: str) -> pb.Item:
    part = pb.ContentPart(input_text=pb.InputText(text=text))
    return pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[part]))


async def test_an_item_of_any_of_the_callers_conversations_is_found_over_both_doors() -> None:
    replies = (Reply(text="Hello Ada."), Reply(text="I'll keep it."), Reply(text="You are Ada."), Reply(text="Yes."))
    async with doors(*replies) as (running, fake):
        status, kept = await call(
            running,
            "POST",
            "/v1/conversations",
            {"items": [{"type": "message", "role": "user", "content": "My name is Ada."}]},
        )
        assert status == 200, kept
        status, listed = await call(running, "GET", f"/v1/conversations/{kept['id']}/items?order=asc")
        named = listed["data"][0]["id"]
        ada = {"role": "user", "content": "My name is Ada."}
        # A create in no conversation at all refers to an item only that conversation holds.
        body = {"model": MODEL, "input": [{"type": "item_reference", "id": named}, {"role": "user", "content": "Hi."}]}
        status, plain = await call(running, "POST", "/v1/responses", body)
        assert status == 200 and plain["status"] == "completed", plain
        assert_schema(plain)
        assert fake.chat_requests[-1]["messages"][0] == ada
        # A create that continues another conversation: that one gains the item itself.
        status, other = await call(running, "POST", "/v1/conversations", {})
        status, continued = await call(running, "POST", "/v1/responses", {**body, "conversation": other["id"]})
        assert status == 200 and continued["status"] == "completed", continued
        status, gained = await call(running, "GET", f"/v1/conversations/{other['id']}/items?order=asc")
        assert gained["data"][0] == listed["data"][0]
        # Over gRPC: the output of a response that is kept only in the conversation (store false).
        unstored = await running.grpc.create(
            pb.CreateResponseRequest(input_text="Who am I?", conversation_id=kept["id"], store=False)
        )
        assert await running.grpc.store.get(unstored.id) is None
        references = [pb.Item(item_reference=pb.ItemReference(id=i)) for i in (named, unstored.output[0].id)]
        again = await running.grpc.create(
            pb.CreateResponseRequest(input_items=pb.ItemList(items=[*references, _user("Sure?")]))
        )
        assert again.status == S.RESPONSE_STATUS_COMPLETED, again.error
        assert fake.chat_requests[-1]["messages"][:2] == [ada, {"role": "assistant", "content": "You are Ada."}]
        listed_input = await running.grpc.stub.ListInputItems(pb.ListInputItemsRequest(response_id=again.id))
        assert listed_input.items[1] == unstored.output[0]


async def test_another_owners_conversation_item_is_not_found_exactly_as_if_it_did_not_exist(tmp_path: Path) -> None:
    credentials = api_keys(tmp_path)
    async with doors(**credentials.settings) as (running, fake):
        alice = credentials.tokens["alice"]
        secret = {"type": "message", "role": "user", "content": "alice's secret"}
        status, hers = await call(running, "POST", "/v1/conversations", {"items": [secret]}, alice)
        assert status == 200, hers
        _, listed = await call(running, "GET", f"/v1/conversations/{hers['id']}/items", token=alice)
        theirs = listed["data"][0]["id"]
        absent = "msg_000000000000"
        (status, found), (missing_status, missing) = [
            await _refer(running, credentials, "bob", item_id) for item_id in (theirs, absent)
        ]
        assert status == missing_status == 404
        assert found["error"]["message"].replace(theirs, "ID") == missing["error"]["message"].replace(absent, "ID")
        assert {k: v for k, v in found["error"].items() if k != "message"} == {
            k: v for k, v in missing["error"].items() if k != "message"
        }
        assert found["error"]["param"] == "input[0].id"
        # Naming her conversation as his own changes nothing: it is not found either.
        body = {"model": MODEL, "input": [{"type": "item_reference", "id": theirs}], "conversation": hers["id"]}
        status, named = await call(running, "POST", "/v1/responses", body, credentials.tokens["bob"])
        assert status == 404 and "secret" not in str(named), named
        answers = []
        for item_id in (theirs, absent):
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await running.grpc.stub.CreateResponse(
                    pb.CreateResponseRequest(
                        input_items=pb.ItemList(items=[pb.Item(item_reference=pb.ItemReference(id=item_id))])
                    ),
                    metadata=credentials.of("bob"),
                ).read()
            error = raised.value
            answers.append((error.code(), (error.details() or "").replace(item_id, "ID"), _violations(error)))
        assert answers[0] == answers[1] and answers[0][0] == grpc.StatusCode.NOT_FOUND
        assert not fake.chat_requests
