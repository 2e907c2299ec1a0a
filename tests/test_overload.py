"""Past its capacity a gateway refuses, never drops: one principal cannot take every slot (nor every
background run), a background run with no bound of its own is bounded, and a client that stops
reading is cut — its response stored with its final status and its slot freed — over both doors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc

from antwort_grpc import pb
from antwort_grpc.providers.base import FinishReason, ProviderEvent, TextDelta, TurnEnd, TurnRequest
from antwort_grpc.providers.scripted import ScriptedProvider
from antwort_grpc.storage.memory import MemoryStore
from tests.auth_fixtures import api_keys
from tests.harness import GatewayClient, collect, running_gateway, user
from tests.http_harness import running_doors
from tests.test_auth import Gated, reason_of

S = pb.ResponseStatus


class Endless(ScriptedProvider):
    """An answer that never ends: 4 KiB of text a delta, as fast as it is read."""

    def __init__(self) -> None:
        super().__init__([])
        self.started = asyncio.Event()

    async def stream(self, turn: TurnRequest) -> AsyncIterator[ProviderEvent]:
        self.started.set()
        chunk = "word " * 820
        while True:
            yield TextDelta(chunk)
            await asyncio.sleep(0)
        yield TurnEnd(FinishReason.STOP, pb.Usage())  # never reached


async def _streaming(gw: GatewayClient, metadata: object, text: str = "wait") -> object:
    request = user(text)
    request.stream = True
    call = gw.stub.CreateResponse(request, metadata=metadata)
    await call.read()
    return call


async def _rest(call: object) -> None:
    """The rest of a stream read with `read` (the two reading APIs do not mix)."""
    while await call.read() != grpc.aio.EOF:  # type: ignore[attr-defined]
        pass


async def _refused(call: object) -> grpc.aio.AioRpcError:
    try:
        await collect(call)
    except grpc.aio.AioRpcError as err:
        return err
    raise AssertionError("not refused")


async def _ended(gw: GatewayClient, response_id: str, metadata: object = ()) -> pb.Response:
    """The response once it ended, read back over gRPC."""
    async with asyncio.timeout(30):
        while True:
            got = await gw.stub.GetResponse(pb.GetResponseRequest(response_id=response_id), metadata=metadata)
            if got.response.status not in (S.RESPONSE_STATUS_QUEUED, S.RESPONSE_STATUS_IN_PROGRESS):
                return got.response  # type: ignore[no-any-return]
            await asyncio.sleep(0.05)


async def _freed(gw: GatewayClient) -> int:
    """The gateway's running count once the cut stream has given its slot back (it is stored
    first, then leaves)."""
    admission = gw.gateway.core.edge.admission
    async with asyncio.timeout(30):
        while admission.running:  # noqa: ASYNC110 - a counter, not an event
            await asyncio.sleep(0.02)
    return admission.running


async def _stored_status(gw: GatewayClient, response_id: str) -> int:
    """The status the response is stored with once it ended (an endless answer is too large to
    read back over gRPC with a client's default limits)."""
    async with asyncio.timeout(30):
        while True:
            record = await gw.store.get(response_id)
            if record is not None and record.response.status not in (
                S.RESPONSE_STATUS_QUEUED,
                S.RESPONSE_STATUS_IN_PROGRESS,
            ):
                return int(record.response.status)
            await asyncio.sleep(0.05)


async def test_one_principal_cannot_take_every_running_slot(tmp_path: Path) -> None:
    credentials = api_keys(tmp_path)
    provider = Gated()
    async with running_gateway(provider=provider, max_running_responses=4, **credentials.settings) as gw:
        alice = credentials.of("alice")
        held = [await _streaming(gw, alice), await _streaming(gw, alice)]
        err = await _refused(gw.stub.CreateResponse(user("one more"), metadata=alice))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and reason_of(err) == "too_many_responses"
        # Half of the running cap is alice's at most: bob still gets a slot.
        bob = await _streaming(gw, credentials.of("bob"))
        provider.gate.set()
        for call in [*held, bob]:
            await _rest(call)


async def test_one_principals_background_runs_hold_at_most_their_share(tmp_path: Path) -> None:
    credentials = api_keys(tmp_path)
    provider = Gated()
    settings = {**credentials.settings, "max_running_responses": 4}
    async with running_gateway(provider=provider, store=MemoryStore(), **settings) as gw:
        background = user("work")
        background.background = True
        alice = credentials.of("alice")
        first = await collect(gw.stub.CreateResponse(background, metadata=alice))
        err = await _refused(gw.stub.CreateResponse(background, metadata=alice))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and reason_of(err) == "too_many_background"
        assert await collect(gw.stub.CreateResponse(background, metadata=credentials.of("bob")))
        provider.gate.set()
        assert (await _ended(gw, first[0].created.response.id, alice)).status == S.RESPONSE_STATUS_COMPLETED
        # Its place is given back when it ends.
        again = await collect(gw.stub.CreateResponse(background, metadata=alice))
        await _ended(gw, again[0].created.response.id, alice)


async def test_a_background_run_bounded_by_nothing_ends_at_the_default_max_duration() -> None:
    provider = Gated()
    async with running_gateway(provider=provider, store=MemoryStore(), background_max_duration=0.5) as gw:
        background = user("forever")
        background.background = True
        started = await collect(gw.stub.CreateResponse(background))
        ended = await _ended(gw, started[0].created.response.id)
        assert ended.status == S.RESPONSE_STATUS_INCOMPLETE
        assert ended.incomplete_details.reason == "max_duration"


async def test_a_grpc_client_that_stops_reading_is_cut_and_its_response_stored() -> None:
    provider = Endless()
    async with running_gateway(provider=provider, stream_write_timeout=0.5) as gw:
        request = user("talk")
        request.stream = True
        call = gw.stub.CreateResponse(request)
        created = (await call.read()).event.created.response.id
        # The client reads nothing more: the server's writes block once the window is full.
        assert await _stored_status(gw, created) == S.RESPONSE_STATUS_CANCELLED
        assert await _freed(gw) == 0
        assert gw.gateway.core.front.stalls.ended == 1
        call.cancel()


async def test_an_http_client_that_stops_reading_is_cut_and_its_response_stored() -> None:
    provider = Endless()
    async with running_doors(provider=provider, stream_write_timeout=0.5) as doors:
        async with aiohttp.ClientSession() as session:
            body = {"model": "", "input": "talk", "stream": True}
            async with session.post(doors.url + "/v1/responses", json=body) as reply:
                assert reply.status == 200
                line = await reply.content.readline()
                assert line.startswith(b"event: response.created")
                await provider.started.wait()
                runs = doors.grpc.gateway.engine.runs
                (response_id,) = runs.running()
                # Nothing more is read: aiohttp stops reading the socket, the server's buffers fill.
                status = await _stored_status(doors.grpc, response_id)
        assert status == S.RESPONSE_STATUS_CANCELLED
        assert await _freed(doors.grpc) == 0
