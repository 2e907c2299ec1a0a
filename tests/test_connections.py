"""The gateway's HTTP/2 connections as gRPC clients expect them (docs/clients.md): keepalive pings
from clients are accepted while a Converse stream waits idle at an approval, and a connection
that reaches its maximum age steers new calls elsewhere without cutting the stream still on it.
The waits here are real seconds, kept short by settings; the Go client's minute with its 10 s
keepalive is tests/interop/test_go_keepalive.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc

from antwort_grpc import pb
from antwort_grpc.providers.scripted import Call, ScriptedProvider
from tests.harness import GatewayClient, function_tool, running_gateway

TERMINAL = {"completed", "incomplete", "failed", "cancelled", "requires_action"}


def approval_request() -> pb.CreateResponseRequest:
    tool = function_tool("send_mail", to="string")
    tool.require_approval.mode = pb.ApprovalMode.APPROVAL_MODE_ALWAYS
    return pb.CreateResponseRequest(input_text="Mail Bob.", tools=[tool])


@asynccontextmanager
async def gateway(**settings: Any) -> AsyncIterator[GatewayClient]:
    provider = ScriptedProvider([[Call.of("send_mail", {"to": "bob"}, call_id="m")]], repeat=True)
    async with running_gateway(provider=provider, **settings) as gw:
        yield gw


async def idle_at_an_approval(channel: grpc.aio.Channel, idle: float) -> str:
    """A Converse session that waits `idle` seconds at an approval, then approves: the kind of the
    event that ends the response, or the status that ended the stream."""
    call = pb.ResponsesServiceStub(channel).Converse(timeout=idle + 30)
    await call.write(pb.ConverseRequest(create=approval_request()))
    try:
        while True:
            message = await call.read()
            assert message is not grpc.aio.EOF, "the stream ended without a status"
            event = message.event.WhichOneof("event")
            if event == "approval_requested":
                await asyncio.sleep(idle)
                decision = pb.ApprovalResponse(call_id="m", approve=True)
                if call.done():  # ended during the wait: its status says why
                    return f"{(await call.code()).name}: {await call.details()}"
                await call.write(pb.ConverseRequest(control=pb.Control(approval=decision)))
            elif event in TERMINAL:
                await call.done_writing()
                return str(event)
    except grpc.aio.AioRpcError as error:
        return f"{error.code().name}: {error.details()}"


async def test_a_client_pinging_every_second_holds_an_idle_stream_when_the_policy_allows_it() -> None:
    # The shape of Go's and Java's keepalive (pings with and without calls), ten times faster on
    # both sides so the test takes seconds.
    pinging = [
        ("grpc.keepalive_time_ms", 1000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    async with (
        gateway(keepalive_min_ping_interval=0.2) as gw,
        grpc.aio.insecure_channel(gw.target, options=pinging) as channel,
    ):
        assert await idle_at_an_approval(channel, idle=6) == "requires_action"


async def test_an_idle_stream_outlives_its_connections_maximum_age() -> None:
    async with gateway(max_connection_age=1) as gw, grpc.aio.insecure_channel(gw.target) as channel:
        assert await idle_at_an_approval(channel, idle=4) == "requires_action"
        # The next call goes out on a new connection and is answered.
        again = await idle_at_an_approval(channel, idle=0)
    assert again == "requires_action"


async def test_a_grace_shorter_than_an_idle_stream_cuts_it_when_the_connection_is_aged_out() -> None:
    # The interaction docs/clients.md warns of: a bounded grace ends a session waiting for a person.
    async with (
        gateway(max_connection_age=1, max_connection_age_grace=1) as gw,
        grpc.aio.insecure_channel(gw.target) as channel,
    ):
        ended = await idle_at_an_approval(channel, idle=5)
    assert ended.startswith("UNAVAILABLE"), ended


class Blackhole:
    """A TCP relay in front of the gateway that can stop relaying without closing anything: the
    client looks alive to the network and never answers again, like a peer whose host vanished."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.frozen = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        for task in self.tasks:
            task.cancel()
        assert self.server is not None
        self.server.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = self.upstream.rsplit(":", 1)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._relay(source, sink))
            self.tasks.add(task)

    async def _relay(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        while data := await source.read(65536):
            if self.frozen.is_set():
                await asyncio.Event().wait()  # holds the bytes and the socket, forever
            sink.write(data)
            await sink.drain()


async def test_the_gateways_pings_find_a_client_that_stopped_answering_and_end_its_stream() -> None:
    async with gateway(keepalive_time=1, keepalive_timeout=1) as gw:
        hole = Blackhole(gw.target)
        async with hole as relay, grpc.aio.insecure_channel(relay) as channel:
            call = pb.ResponsesServiceStub(channel).Converse(timeout=120)
            await call.write(pb.ConverseRequest(create=approval_request()))
            while (message := await call.read()).event.WhichOneof("event") != "approval_requested":
                assert message is not grpc.aio.EOF
            [running] = gw.gateway.engine.runs.running()
            hole.frozen.set()  # the client is gone without a word, while its run waits for an approval
            # The approval would wait its 300 s; the unanswered pings end the stream long before.
            ended = await gw.gateway.engine.runs.wait_idle(30)
            call.cancel()
        stored = await gw.store.get(running)
    assert ended, "the run still waits for a client that is gone"
    assert stored is not None and stored.response.status == pb.ResponseStatus.RESPONSE_STATUS_CANCELLED
