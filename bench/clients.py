"""Clients of the two sides the benchmarks compare: the gateway over gRPC, the backend over HTTP."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import grpc

from antwort_grpc import pb
from antwort_grpc.providers.base import TurnRequest
from antwort_grpc.providers.openai.request import build_body

# Whatever a call returns; the drivers below only time it.
Call = Callable[[], Awaitable[Any]]


def user_item(text: str) -> pb.Item:
    part = pb.ContentPart(input_text=pb.InputText(text=text))
    return pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[part]))


def function_tool(name: str) -> pb.Tool:
    tool = pb.Tool(function=pb.FunctionTool(name=name, description=f"the {name} tool"))
    tool.function.parameters.update({"type": "object", "properties": {}})
    return tool


@dataclass
class StreamRead:
    """One response read as a stream, with client-side timestamps (perf_counter seconds)."""

    started: float
    events: int = 0
    first_event: float = 0.0
    first_text: float = 0.0
    ended: float = 0.0
    terminal: str = ""
    sequence_ok: bool = True
    response_id: str = ""
    # Nanoseconds from the backend writing a stamped token to this client reading its event, and
    # when it was read (perf_counter seconds).
    lags_ns: list[int] = field(default_factory=list)
    lag_times: list[float] = field(default_factory=list)


async def read_stream(
    stub: Any,
    request: pb.CreateResponseRequest,
    *,
    stamped: bool = False,
    on_first_text: Callable[[], None] | None = None,
) -> StreamRead:
    read = StreamRead(time.perf_counter())
    async for message in stub.CreateResponse(request):
        now = time.perf_counter()
        event = message.event
        read.events += 1
        if read.events == 1:
            read.first_event = now
        if event.sequence_number != read.events:
            read.sequence_ok = False
        kind = event.WhichOneof("event")
        if kind == "output_text_delta":
            if not read.first_text:
                read.first_text = now
                if on_first_text is not None:
                    on_first_text()
            if stamped:
                # One stamp per token; a merged delta carries several.
                arrived = time.monotonic_ns()
                for stamp in event.output_text_delta.delta.split():
                    read.lags_ns.append(arrived - int(stamp))
                    read.lag_times.append(now)
        elif kind in ("completed", "incomplete", "failed", "cancelled", "requires_action"):
            read.terminal = kind
            read.response_id = getattr(event, kind).response.id
    read.ended = time.perf_counter()
    return read


async def create(stub: Any, request: pb.CreateResponseRequest) -> pb.Response:
    """A non-streaming CreateResponse: the one terminal event's Response."""
    response = pb.Response()
    async for message in stub.CreateResponse(request):
        event = message.event
        response = getattr(event, event.WhichOneof("event")).response
    return response


class Direct:
    """Straight to the backend: the request the gateway's provider would send."""

    def __init__(self, url: str, model: str) -> None:
        self.url = url + "/chat/completions"
        turn = TurnRequest(model=model, instructions="", items=[user_item("hello")], tools=[])
        self.plain = json.dumps(build_body(turn, stream=False, model=model)).encode()
        self.streamed = json.dumps(build_body(turn, stream=True, model=model)).encode()
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Direct:
        connector = aiohttp.TCPConnector(limit=256)
        headers = {"Content-Type": "application/json"}
        self.session = aiohttp.ClientSession(connector=connector, headers=headers, trust_env=False)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.session is not None
        await self.session.close()

    async def complete(self) -> dict[str, Any]:
        assert self.session is not None
        async with self.session.post(self.url, data=self.plain) as response:
            response.raise_for_status()
            answer: dict[str, Any] = json.loads(await response.read())
        return answer

    async def first_token(self) -> tuple[float, float]:
        """(seconds to the first content delta, seconds to the end) of a streamed answer."""
        assert self.session is not None
        started = time.perf_counter()
        first = 0.0
        buffer = b""
        async with self.session.post(self.url, data=self.streamed) as response:
            response.raise_for_status()
            async for block in response.content.iter_any():
                if first:
                    continue
                buffer += block
                *events, buffer = buffer.split(b"\n\n")
                for event in events:
                    data = event.removeprefix(b"data: ")
                    if data == b"[DONE]":
                        continue
                    choices = json.loads(data).get("choices") or [{}]
                    if choices[0].get("delta", {}).get("content"):
                        first = time.perf_counter()
                        break
        return first - started, time.perf_counter() - started


async def drive(call: Call, requests: int, concurrency: int) -> tuple[list[float], float]:
    """Run `requests` calls with `concurrency` workers: (latency of each, wall seconds)."""
    latencies: list[float] = []
    remaining = requests

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - started


def channel(target: str) -> grpc.aio.Channel:
    # Each channel its own connection, as separate clients would have.
    return grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
