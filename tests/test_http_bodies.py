"""What a body of the HTTP door may cost before it is refused, and that no body makes a 500: the
request size limit both doors share applies to it as it is read, its counts are checked before it
is mapped, a large one is parsed and mapped off the event loop (in the worker process), and
invalid Unicode, deep nesting and deep schemas are 400s naming the parameter, each one log line
without a traceback — as are requests aiohttp itself cannot parse."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from antwort_grpc import offload
from antwort_grpc.providers.scripted import ScriptedProvider, Text
from tests.http_harness import Doors, assert_schema, running_doors

MODEL = "test-model"
LONE = "\ud800"


def answering() -> ScriptedProvider:
    return ScriptedProvider([[Text("fine")]], repeat=True)


async def post_raw(doors: Doors, path: str, data: bytes | AsyncIterator[bytes]) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(doors.url + path, data=data, headers={"Content-Type": "application/json"}) as response,
    ):
        text = await response.text()
        return response.status, json.loads(text) if text.startswith("{") else text


def encoded(body: Any) -> bytes:
    """`body` as JSON, a lone surrogate written as the escape a client would send."""
    return json.dumps(body).encode()


def assert_refused(status: int, answer: Any, expected_status: int, param: str | None) -> None:
    assert status == expected_status, answer
    assert_schema(answer["error"], "ErrorPayload")
    assert answer["error"]["param"] == param, answer


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


# ----------------------------------------------------------------------- size and counts


async def test_a_body_past_the_request_limit_is_a_413_said_before_it_is_read() -> None:
    async with running_doors(provider=answering(), max_request_bytes=32 * 1024) as doors:
        big = encoded({"model": MODEL, "input": "x" * 40_000})
        status, answer = await post_raw(doors, "/v1/responses", big)
        assert_refused(status, answer, 413, None)
        assert "at most 32768 (ANTWORT_MAX_REQUEST_BYTES)" in answer["error"]["message"]

        async def chunked() -> AsyncIterator[bytes]:
            # No Content-Length: refused once what came passes the limit.
            for _ in range(64):
                yield b" " * 1024
            yield big

        status, answer = await post_raw(doors, "/v1/responses", chunked())
        assert_refused(status, answer, 413, None)
        assert "at least" in answer["error"]["message"]
        # Within it, the same door answers.
        status, answer = await post_raw(doors, "/v1/responses", encoded({"model": MODEL, "input": "x" * 1000}))
        assert status == 200, answer


async def test_the_item_count_is_checked_before_any_item_is_mapped() -> None:
    """3,000 items whose last is not an item: refused for their count (before the mapping would
    have reached the last one)."""
    items: list[Any] = [{"role": "user", "content": "hi"}] * 2999 + [{"type": "no such item"}]
    async with running_doors(provider=answering()) as doors:
        status, answer = await post_raw(doors, "/v1/responses", encoded({"model": MODEL, "input": items}))
        assert_refused(status, answer, 400, "input")
        assert "at most 2048 items (this request has 3000" in answer["error"]["message"]
        many = [{"role": "user", "content": [{"type": "input_text", "text": "x"}] * 4097}] * 2 + [{"type": "x"}]
        status, answer = await post_raw(doors, "/v1/responses", encoded({"model": MODEL, "input": many}))
        assert_refused(status, answer, 400, "input")
        assert "at most 8192 content parts in all (this has 8194" in answer["error"]["message"]
        tools = [{"type": "function", "name": f"t{n}"} for n in range(129)] + [{"type": "no such tool"}]
        status, answer = await post_raw(doors, "/v1/responses", encoded({"model": MODEL, "input": "x", "tools": tools}))
        assert_refused(status, answer, 400, "tools")


async def test_a_large_body_is_parsed_and_mapped_in_the_worker_process_while_the_loop_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A body over INLINE_BYTES is mapped in the worker process (never by this process's
    mapping), and the event loop goes on meanwhile: a task that counts its turns counts some
    while the body is read."""
    from antwort_grpc.http import body as http_body

    mapped_here: list[int] = []
    mapping = http_body.create_request

    def counting(body: object) -> Any:
        mapped_here.append(1)
        return mapping(body)

    monkeypatch.setattr(http_body, "create_request", counting)
    turns = 0

    async def ticking() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    during: list[int] = []
    real = http_body.off_process

    async def watched(function: Callable[..., Any], *args: Any) -> Any:
        before = turns
        result = await real(function, *args)
        during.append(turns - before)
        return result

    monkeypatch.setattr(http_body, "off_process", watched)
    items = [{"role": "user", "content": f"message {n} " + "w" * 200} for n in range(1000)]
    async with running_doors(provider=answering()) as doors:
        ticker = asyncio.create_task(ticking())
        try:
            large = encoded({"model": MODEL, "input": items})
            assert len(large) > http_body.INLINE_BYTES
            status, answer = await post_raw(doors, "/v1/responses", large)
            assert status == 200, answer
            assert mapped_here == [] and offload.process_started()
            assert len(during) == 1 and during[0] > 0, during
            # A small body is mapped here, on the loop.
            status, answer = await post_raw(doors, "/v1/responses", encoded({"model": MODEL, "input": "hi"}))
            assert status == 200 and mapped_here == [1], answer
        finally:
            ticker.cancel()


# --------------------------------------------------------------- bodies that made a 500


def _with(path: str, value: Any, body: dict[str, Any]) -> dict[str, Any]:
    return {**body, path: value}


BASE = {"model": MODEL, "input": "hi"}
TEXT_PART = {"type": "input_text", "text": LONE}
CALL = {"type": "function_call", "call_id": "c", "name": "f", "arguments": LONE}
FUNCTION = {"type": "function", "name": "f"}
# A lone surrogate in each string a create request may carry: the parameter named.
SURROGATES: list[tuple[dict[str, Any], str]] = [
    ({**BASE, "model": LONE}, "model"),
    ({**BASE, "input": LONE}, "input"),
    ({**BASE, "input": [{"role": "user", "content": LONE}]}, "input[0].content"),
    (
        {**BASE, "input": [{"role": "user", "content": [{"type": "input_text", "text": LONE}]}]},
        "input[0].content[0].text",
    ),
    (
        {**BASE, "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": LONE}]},
        "input[0].arguments",
    ),
    ({**BASE, "input": [{"type": "function_call_output", "call_id": LONE, "output": "x"}]}, "input[0].call_id"),
    ({**BASE, "instructions": LONE}, "instructions"),
    ({**BASE, "previous_response_id": LONE}, "previous_response_id"),
    ({**BASE, "metadata": {"k": LONE}}, "metadata.k"),
    ({**BASE, "metadata": {LONE: "v"}}, "metadata"),
    ({**BASE, "tools": [{**FUNCTION, "name": LONE}]}, "tools[0].name"),
    ({**BASE, "tools": [{**FUNCTION, "description": LONE}]}, "tools[0].description"),
    ({**BASE, "tools": [{**FUNCTION, "parameters": {"type": "object", "title": LONE}}]}, "tools[0].parameters.title"),
    ({**BASE, "tools": [FUNCTION], "tool_choice": {"type": "function", "name": LONE}}, "tool_choice.name"),
    ({**BASE, "truncation": LONE}, "truncation"),
    ({**BASE, "user": LONE}, "user"),
]


@pytest.mark.parametrize(("body", "param"), SURROGATES, ids=[param for _, param in SURROGATES])
async def test_a_lone_surrogate_anywhere_in_a_create_is_a_400_naming_it(
    body: dict[str, Any], param: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_doors(provider=answering()) as doors:
        caplog.set_level(logging.INFO)
        status, answer = await post_raw(doors, "/v1/responses", encoded(body))
        assert_refused(status, answer, 400, param)
        assert "lone surrogate" in answer["error"]["message"]
        no_tracebacks(caplog)
        assert len([r for r in caplog.records if r.name.startswith("antwort_grpc.http")]) == 1, caplog.text


CONTROL_BODIES = [
    ("steer", {"input": LONE}, "input"),
    ("follow_up", {"input": [{"role": "user", "content": LONE}]}, "input[0].content"),
    ("approval", {"approval_request_id": LONE, "approve": True}, "approval_request_id"),
    ("pause", {"reason": LONE}, "reason"),
    ("resume", {"x": LONE}, "x"),
]


async def test_a_lone_surrogate_in_a_control_or_a_compaction_is_a_400(caplog: pytest.LogCaptureFixture) -> None:
    async with running_doors(provider=answering()) as doors:
        caplog.set_level(logging.INFO)
        for name, body, param in CONTROL_BODIES:
            status, answer = await post_raw(doors, f"/v1/responses/resp_1/{name}", encoded(body))
            assert_refused(status, answer, 400, param)
        for body, param in [({**BASE, "input": LONE}, "input"), ({**BASE, "instructions": LONE}, "instructions")]:
            status, answer = await post_raw(doors, "/v1/responses/compact", encoded(body))
            assert_refused(status, answer, 400, param)
        no_tracebacks(caplog)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


async def test_deep_nesting_and_deep_schemas_are_400s_naming_where(caplog: pytest.LogCaptureFixture) -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(90):
        schema = {"type": "object", "properties": {"a": schema}}
    shallower: dict[str, Any] = {"type": "string"}
    for _ in range(11):
        shallower = {"type": "object", "properties": {"a": shallower}}
    cases: list[tuple[bytes, str]] = [
        # Past the parser's own recursion: the body.
        (b'{"model": "", "input": "x", "include": ' + nested(1000).encode() + b"}", "body"),
        # Parsed, past the body's nesting: the parameter it is in.
        (b'{"model": "", "input": "x", "include": ' + nested(100).encode() + b"}", "include[0][0]"),
        (encoded({**BASE, "tools": [{**FUNCTION, "parameters": schema}]}), "tools[0].parameters"),
        # Within the body's nesting, past the schema depth limit (20; a protobuf Struct cannot
        # carry much more): refused before it is made a Struct.
        (encoded({**BASE, "tools": [{**FUNCTION, "parameters": shallower}]}), "tools[0].parameters"),
        (b'{"model": "", "input": "x", "temperature": NaN}', "body"),
        (b'{"model": "", "input": "\xed\xa0\x80"}', "body"),
    ]
    async with running_doors(provider=answering()) as doors:
        caplog.set_level(logging.INFO)
        for data, param in cases:
            for path in ("/v1/responses", "/v1/responses/resp_1/steer"):
                if path != "/v1/responses" and param.startswith("tools"):
                    continue
                status, answer = await post_raw(doors, path, data)
                assert_refused(status, answer, 400, param)
        no_tracebacks(caplog)


async def test_what_aiohttp_cannot_parse_is_one_warning_line(caplog: pytest.LogCaptureFixture) -> None:
    requests = [
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /he alth HTTP/9.9\r\n\r\n",
    ]
    async with running_doors(provider=answering()) as doors:
        caplog.set_level(logging.DEBUG, logger="aiohttp.server")
        for raw in requests:
            caplog.clear()
            reader, writer = await asyncio.open_connection(doors.door.host, doors.door.port)
            writer.write(raw)
            await writer.drain()
            answer = await reader.read()
            writer.close()
            assert b" 400 Bad Request\r\n" in answer, answer[:200]
            warnings = [r for r in caplog.records if r.name == "aiohttp.server" and r.levelno >= logging.WARNING]
            assert len(warnings) == 1, caplog.text
            assert warnings[0].levelno == logging.WARNING and warnings[0].exc_info is None, caplog.text
            assert "\n" not in warnings[0].getMessage()
