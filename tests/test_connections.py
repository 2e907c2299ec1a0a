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
        gateway(keepalive_min_ping_interval=0.5) as gw,
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
