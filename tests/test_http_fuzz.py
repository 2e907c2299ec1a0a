"""Any JSON a client may send to `POST /v1/responses` gets a typed answer: a response (200) or the
spec's error object with a 4xx status naming a parameter, never a 500 or a dropped connection.
Generated bodies: the spec's parameters with values of any JSON type, items and tools of any shape;
and any bytes: valid bodies mutated at random (bytes flipped, cut, repeated, invalid Unicode and
deep nesting spliced in), sent to the create, compact and control routes."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from antwort_grpc.providers.scripted import ScriptedProvider, Text
from tests.http_harness import assert_schema, running_doors

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
parts = st.fixed_dictionaries(
    {"type": st.sampled_from(["input_text", "input_image", "output_text", "x"])},
    optional={"text": json_values, "image_url": json_values},
)
item_fields = ["role", "content", "call_id", "name", "arguments", "output", "summary"]
items = st.fixed_dictionaries(
    {"type": st.sampled_from(["message", "function_call", "function_call_output", "reasoning", "x"])},
    optional={
        **{name: json_values for name in item_fields},
        "role": st.sampled_from(["user", "assistant", "system", "developer", "x"]) | json_values,
        "content": json_values | st.lists(parts, max_size=2),
    },
)
tools = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "mcp", "code_interpreter", "x"])},
    optional={"name": json_values, "parameters": json_values, "server_label": json_values},
)
text = st.text(max_size=12)
valid_items = st.one_of(
    st.builds(lambda t: {"role": "user", "content": t}, text),
    st.builds(
        lambda t: {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": t}]}, text
    ),
)
# A valid value of each parameter: a body mixes them with values of any JSON type.
VALID = {
    "instructions": text,
    "tools": st.just([{"type": "function", "name": "f"}]),
    "tool_choice": st.sampled_from(["auto", "none"]),
    "metadata": st.dictionaries(st.from_regex(r"[a-z]{1,8}", fullmatch=True), text, max_size=2),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "parallel_tool_calls": st.booleans(),
    "max_output_tokens": st.integers(16, 4096),
    "store": st.booleans(),
    "truncation": st.sampled_from(["auto", "disabled"]),
    "text": st.just({"format": {"type": "text"}}),
    "stream": st.booleans(),
    "include": st.just([]),
    "reasoning": st.just({"effort": "low"}),
}
extras = st.lists(
    st.sampled_from(sorted(VALID)).flatmap(lambda name: st.tuples(st.just(name), VALID[name] | json_values)),
    max_size=3,
).map(dict)
bodies = st.builds(
    lambda base, extra: {**base, **extra},
    st.fixed_dictionaries(
        {
            "model": st.just("") | json_values,
            "input": text | st.lists(valid_items, min_size=1, max_size=3) | st.lists(items, max_size=3) | json_values,
        },
        optional={"tools": st.lists(tools, max_size=2)},
    ),
    extras,
)


class Door:
    """A gateway with its HTTP door, served by an event loop of its own thread."""

    def __init__(self) -> None:
        self.url = ""
        self.statuses: list[int] = []
        self.ready = threading.Event()
        self.stop: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _serve(self) -> None:
        self.loop, self.stop = asyncio.get_running_loop(), asyncio.Event()
        async with running_doors(provider=ScriptedProvider([[Text("fine")]], repeat=True)) as doors:
            self.url = doors.url
            self.ready.set()
            await self.stop.wait()

    def post(self, body: Any, path: str = "/v1/responses") -> tuple[int, Any]:
        return self.post_raw(json.dumps(body).encode(), path)

    def post_raw(self, data: bytes, path: str = "/v1/responses") -> tuple[int, Any]:
        request = urllib.request.Request(self.url + path, data, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()


@pytest.fixture(scope="module")
def door() -> Iterator[Door]:
    served = Door()
    served.thread.start()
    assert served.ready.wait(30)
    yield served
    assert served.loop is not None and served.stop is not None
    served.loop.call_soon_threadsafe(served.stop.set)
    served.thread.join(30)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(bodies)
def test_any_json_body_gets_a_response_or_a_spec_error_naming_a_parameter(door: Door, body: dict[str, Any]) -> None:
    status, raw = door.post(body)
    door.statuses.append(status)
    if status == 200:
        if body.get("stream") is True:
            assert raw.startswith(b"event: response.created"), raw[:200]
        else:
            assert_schema(json.loads(raw))
        return
    assert 400 <= status < 500, (status, raw[:500])
    error = json.loads(raw)["error"]
    assert_schema(error, "ErrorPayload")
    assert error["param"], error


def test_the_generated_bodies_reached_the_core_too(door: Door) -> None:
    """Run after the property: some bodies were answered, not all refused by the door's checks."""
    assert 200 in door.statuses and any(status != 200 for status in door.statuses), sorted(set(door.statuses))


# ------------------------------------------------------------------------- mutated bytes

SEED_BODIES = [
    {"model": "", "input": "hi"},
    {"model": "", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}], "stream": True},
    {
        "model": "",
        "input": [{"type": "function_call_output", "call_id": "c1", "output": "42"}],
        "instructions": "be brief",
        "metadata": {"k": "v"},
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"a": {}}}}],
        "tool_choice": {"type": "function", "name": "f"},
    },
    {"input": "x", "reason": "why", "approval_request_id": "a1", "approve": True},
]
# What a mutation splices in: invalid Unicode (escaped and raw), deep nesting, numbers JSON or
# Python cannot hold, broken escapes and structure.
SPLICES = [
    b'"\\ud800"',
    b'"\\udc00x"',
    b'"a\\ud83d"',
    b"\\ud800",
    b"\\u00",
    b"\xed\xa0\x80",
    b"\xff\xfe",
    b"\x00",
    b"[" * 1000,
    b"{" * 200,
    b'{"a":' * 120 + b"1" + b"}" * 120,
    b"[" * 90 + b"]" * 90,
    b"NaN",
    b"-Infinity",
    b"1e999",
    b"9" * 5000,
    b"null",
    b"true",
    b'"',
    b",",
    b":",
    b"}",
    b"]",
]
ROUTES = ["/v1/responses"] * 6 + ["/v1/responses/compact", "/v1/responses/resp_x/steer", "/v1/responses/resp_x/pause"]


def mutated(rng: random.Random) -> bytes:
    data = bytearray(json.dumps(rng.choice(SEED_BODIES)).encode())
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(data) + 1)
        operation = rng.randrange(6)
        if operation == 0 and data:
            data[min(at, len(data) - 1)] = rng.randrange(256)
        elif operation == 1:
            data[at:at] = rng.choice(SPLICES)
        elif operation == 2:
            del data[at : at + rng.randint(1, 8)]
        elif operation == 3:
            data[at:at] = data[at : at + rng.randint(1, 16)] * rng.randint(2, 50)
        elif operation == 4:
            # A string's contents replaced by an escape that is no character.
            quote = data.find(b'"', at)
            if quote >= 0:
                data[quote + 1 : quote + 1] = rng.choice([b"\\ud800", b"\\udfff", b"\\ud800\\ud800"])
        else:
            del data[at:]
    return bytes(data)


def test_random_mutations_of_bodies_are_never_a_500(door: Door) -> None:
    rng = random.Random(20261127)
    failures = []
    for n in range(1500):
        data, route = mutated(rng), rng.choice(ROUTES)
        status, raw = door.post_raw(data, route)
        if status >= 500:
            failures.append((n, route, status, data[:200], raw[:300]))
    assert not failures, (len(failures), failures[:5])
