"""A burst of calls reaching a gateway whose event loop is busy is taken in without a round trip
through grpc for each call (antwort_grpc/grpc_accept.py).

grpc.aio on its own asks grpc for the next call of a method only once the last one has come
through grpc's completion queue and the loop: some five turns of the loop a call. At hundreds of
streams a turn lasts tens of milliseconds, the burst is taken in a few calls a second, and grpc
cancels the calls still waiting after 30 s (the 1,000-stream benchmark lost hundreds so). What is
counted here is turns of the loop, each made to cost a little work as the other streams' would,
not time: the calls arrive while the loop is held, then it runs until the model was asked for
every one of them.

A flood larger than grpc lets wait by default (1,000 calls of a method, then a growing share
dropped) is taken in whole, and each of its calls answered by admission: none is dropped by grpc
as CANCELLED before the gateway sees it."""

from __future__ import annotations

import asyncio
import collections
import gc
import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc._cython import cygrpc

from antwort_grpc import pb
from antwort_grpc.providers.base import FinishReason, ProviderEvent, TextDelta, TurnEnd, TurnRequest
from antwort_grpc.providers.scripted import ScriptedProvider, Text
from tests.harness import running_gateway

BURST = 32
# Past grpc's own bound on calls waiting to be taken in (1,000, then a growing share dropped):
# some 250 of these would be dropped by it.
FLOOD = 2000
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


async def _turns_to_take_in_a_burst() -> int:
    """The loop turns a gateway busy with other streams takes to take in a burst of BURST calls
    that reached its grpc while its loop was held."""
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
            return turns
        finally:
            sender.join()
            for call in calls:
                call.cancel()
            channel.close()
            provider.release.set()


async def test_a_burst_reaching_a_busy_gateway_is_taken_in_at_fewer_than_three_loop_turns_a_call() -> None:
    # grpc.aio alone: at least four turns a call (request, completion, task, wait). How many turns
    # grpc's threads need depends on their getting a core between two turns: on a host whose cores
    # other processes hold, one burst may take more, so the best of three counts.
    counted = []
    for _ in range(3):
        counted.append(await _turns_to_take_in_a_burst())
        if counted[-1] < 3 * BURST:
            break
    assert min(counted) < 3 * BURST, f"{counted} turns of the loop to take in {BURST} calls"


async def test_a_gateway_stopped_with_calls_asked_ahead_logs_no_error(caplog: pytest.LogCaptureFixture) -> None:
    # The requests still with grpc end with its shutdown error when the server stops.
    async with running_gateway(provider=Held()):
        pass
    gc.collect()
    await asyncio.sleep(0)
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []


# A flood of creates is run or refused by admission; one of attaches (an attach storm; here on a
# response that is not there) is answered by the attach's own handler.
FLOODS = {
    "CreateResponse": (pb.CreateResponseRequest(input_text="hi", stream=True), {"OK", "RESOURCE_EXHAUSTED"}),
    "AttachResponse": (pb.AttachResponseRequest(response_id="resp_0123456789abcdef01234567"), {"NOT_FOUND"}),
}


@pytest.mark.parametrize("method", list(FLOODS))
async def test_a_flood_reaching_a_busy_gateway_is_answered_by_it_never_cancelled_by_grpc(method: str) -> None:
    """Twice as many calls as grpc lets wait by default reach a gateway while its loop is held (as
    a loop serving a thousand streams is): every one is taken in and answered by the gateway, a
    create run or refused by admission with RESOURCE_EXHAUSTED and pushback. None ends
    CANCELLED, which grpc gives a call it drops before the gateway sees it."""
    request, answers = FLOODS[method]
    provider = ScriptedProvider([[Text("done")]], repeat=True)
    async with running_gateway(provider=provider, max_running_responses=8) as gw:
        before = calls_arrived()
        channel = grpc.insecure_channel(gw.target)
        start = getattr(pb.ResponsesServiceStub(channel), method)
        calls: list[Any] = []
        arrived = threading.Event()

        def flood() -> None:
            calls.extend(start(request) for _ in range(FLOOD))
            while calls_arrived() - before < FLOOD:
                time.sleep(0.001)
            arrived.set()

        def outcome(call: Any) -> str:
            try:
                for _ in call:
                    pass
            except grpc.RpcError as err:
                return str(err.code().name)
            return "OK"

        sender = threading.Thread(target=flood)
        sender.start()
        try:
            # The loop is held while the flood reaches grpc and waits there.
            assert arrived.wait(120), "the flood never reached the gateway's grpc"
            sender.join()
            outcomes = collections.Counter(await asyncio.to_thread(lambda: [outcome(call) for call in calls]))
        finally:
            sender.join()
            for call in calls:
                call.cancel()
            channel.close()
    assert set(outcomes) <= answers and sum(outcomes.values()) == FLOOD, outcomes
    if method == "CreateResponse":
        assert outcomes["OK"] >= 8, outcomes
