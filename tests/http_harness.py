"""A real gateway serving both doors on loopback ports, for the tests of the HTTP/SSE door, and the
Open Responses schema (the OpenAPI document bundled in `llm-comply`) every body and event is
checked against."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema

from antwort_grpc.http.door import DoorSettings, HttpDoor
from tests.harness import GatewayClient, running_gateway


@dataclass
class Doors:
    grpc: GatewayClient
    door: HttpDoor

    @property
    def url(self) -> str:
        return self.door.url

    @property
    def base_url(self) -> str:
        """What an OpenAI SDK is given."""
        return self.door.url + "/v1"


@asynccontextmanager
async def running_doors(door_settings: DoorSettings | None = None, **gateway: Any) -> AsyncIterator[Doors]:
    async with running_gateway(**gateway) as client:
        gateway = client.gateway
        door = HttpDoor(gateway.core.front, door_settings, gateway.accepting)
        await door.start("127.0.0.1:0")
        # The process root drains, refuses and closes it with the gRPC door.
        await gateway.open(door)
        try:
            yield Doors(client, door)
        finally:
            await door.stop()


@cache
def spec() -> dict[str, Any]:
    """The Open Responses OpenAPI document (2026-04-24) as llm-comply ships it."""
    import llm_comply.specs

    loaded: dict[str, Any] = json.loads((Path(llm_comply.specs.__file__).parent / "openresponses.json").read_text())
    return loaded


@cache
def validator(schema: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(
        {"$ref": f"#/components/schemas/{schema}", "components": spec()["components"]}
    )


def schema_errors(body: Any, schema: str) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(schema).iter_errors(body)]


def assert_schema(body: Any, schema: str = "ResponseResource") -> None:
    errors = schema_errors(body, schema)
    assert not errors, f"{schema}: {errors}\n{json.dumps(body)[:2000]}"


def assert_event_schema(event: dict[str, Any]) -> None:
    from llm_comply.schema import SSE_EVENT_TO_SCHEMA

    schema = SSE_EVENT_TO_SCHEMA.get(event["type"])
    assert schema is not None, f"{event['type']} is not an event of the spec"
    assert_schema(event, schema)


async def sse_events(response: aiohttp.ClientResponse) -> list[dict[str, Any]]:
    """The events of an SSE response, each checked: its `event:` name is its type, and the
    stream ends with the spec's literal `data: [DONE]` after them."""
    events: list[dict[str, Any]] = []
    name = ""
    done = False
    async for raw in response.content:
        line = raw.decode().rstrip("\r\n")
        assert not done or not line, f"{line!r} after [DONE]"
        if line == "data: [DONE]":
            done = True
        elif line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            event = json.loads(line[len("data: ") :])
            assert event["type"] == name, (name, event["type"])
            events.append(event)
    assert done, "the stream ended without data: [DONE]"
    return events
