"""A burst of calls reaching a gateway whose event loop is busy is taken in without a round trip
through grpc for each call (antwort_grpc/grpc_accept.py).

grpc.aio on its own asks grpc for the next call of a method only once the last one has come
through grpc's completion queue and the loop: some five turns of the loop a call. At hundreds of
streams a turn lasts tens of milliseconds, the burst is taken in a few calls a second, and grpc
cancels the calls still waiting after 30 s (the 1,000-stream benchmark lost hundreds so). What is
counted here is turns of the loop, each made to cost a little work as the other streams' would,
not time: the calls arrive while the loop is held, then it runs until the model was asked for
every one of them."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import threading
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc._cython import cygrpc

from antwort_grpc import pb
from antwort_grpc.providers.base import FinishReason, ProviderEvent, TextDelta, TurnEnd, TurnRequest
from antwort_grpc.providers.scripted import ScriptedProvider
from tests.harness import running_gateway

BURST = 32
# The rest of the loop's work in one turn (other streams' events): long enough that grpc's own
# threads deliver what they have between two turns.
TURN_WORK = 0.002


class Held(ScriptedProvider):
    """Counts the turns it is asked for and holds each one open until `release`."""

    def __init__(self) -> None:
        super().__init__([])
        self.asked = 0
        self.release = asyncio.Event()

    async def stream(self, turn: TurnRequest) -> AsyncIterator[ProviderEvent]:
        self.asked += 1
        await self.release.wait()
        yield TextDelta("done")
        yield TurnEnd(FinishReason.STOP)


def other_streams_work(seconds: float) -> None:
    """What the loop's other streams would do in a turn: Python work, holding the GIL."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def calls_arrived() -> int:
    """grpc's own count of the calls that reached this process's servers (channelz), taken in or
    not: readable while the event loop is held."""
    servers = json.loads(cygrpc.channelz_get_servers(0)).get("server", [])
    return sum(int(server["data"].get("callsStarted", 0)) for server in servers)


async def test_a_burst_reaching_a_busy_gateway_is_taken_in_at_fewer_than_three_loop_turns_a_call() -> None:
    provider = Held()
    async with running_gateway(provider=provider) as gw:
        before = calls_arrived()
        channel = grpc.insecure_channel(gw.target)
        stub = pb.ResponsesServiceStub(channel)
        request = pb.CreateResponseRequest(input_text="hi", stream=True)
        calls: list[grpc.Future] = []
        arrived = threading.Event()

        def burst() -> None:
            calls.extend(stub.CreateResponse(request) for _ in range(BURST))
            while calls_arrived() - before < BURST:
                time.sleep(0.001)
            arrived.set()

        sender = threading.Thread(target=burst)
        sender.start()
        try:
            # The loop is held (as a busy one is) while the burst reaches grpc.
            assert arrived.wait(60), "the burst never reached the gateway's grpc"
            turns = 0
            while provider.asked < BURST:
                other_streams_work(TURN_WORK)
                turns += 1
                await asyncio.sleep(0)
            # grpc.aio alone: at least four turns a call (request, completion, task, wait).
            assert turns < 3 * BURST, f"{turns} turns of the loop to take in {BURST} calls"
        finally:
            sender.join()
            for call in calls:
                call.cancel()
            channel.close()
            provider.release.set()


async def test_a_gateway_stopped_with_calls_asked_ahead_logs_no_error(caplog: pytest.LogCaptureFixture) -> None:
    # The requests still with grpc end with its shutdown error when the server stops.
    async with running_gateway(provider=Held()):
        pass
    gc.collect()
    await asyncio.sleep(0)
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []
