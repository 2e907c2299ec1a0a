"""A gateway killed with SIGKILL in the middle of a stream and started again on the same store: a
real `antwort-grpc serve` process, the fake OpenAI-compatible backend streaming slow tokens."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from antwort_grpc import pb
from antwort_grpc.storage.base import INTERRUPTED
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply
from tests.harness import user
from tests.storage.processes import Stream, create, gateway_process, get, replica_gone

S = pb.ResponseStatus


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/gateway.db"
    url: str = request.getfixturevalue("postgres_url")
    return url


async def test_a_gateway_killed_mid_stream_leaves_the_response_failed_interrupted_after_a_restart(
    store_url: str,
) -> None:
    async with FakeOpenAI(Reply(text="Done quickly."), Reply(text="word " * 400, delay=0.02)) as fake:
        async with gateway_process(store_url, fake.url) as first:
            completed = await create(first, user("quick one"))
            assert completed.status == S.RESPONSE_STATUS_COMPLETED
            stream = Stream(first, user("talk slowly"))
            await stream.wait_for_deltas(3)
            first.kill()
            await first.process.wait()
            with pytest.raises(grpc.aio.AioRpcError):
                await stream.finished()
        response_id = stream.response_id
        if store_url.startswith("postgresql"):
            # The restarted process sweeps at startup; make sure the server has noticed the death.
            await replica_gone(store_url, response_id)

        async with gateway_process(store_url, fake.url) as second:
            interrupted = await get(second, response_id)
            assert interrupted.status == S.RESPONSE_STATUS_FAILED
            assert interrupted.error.code == INTERRUPTED
            assert await get(second, completed.id) == completed, "completed responses are intact"
            items = await second.stub.ListInputItems(pb.ListInputItemsRequest(response_id=response_id))
            assert [p.input_text.text for i in items.items for p in i.message.content] == ["talk slowly"]
