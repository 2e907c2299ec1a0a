"""A gateway killed with SIGKILL in the middle of a stream and started again on the same store: a
real `antwort-grpc serve` process, the fake OpenAI-compatible backend streaming slow tokens. What
the dead process finished is intact, and its requires_action response continues on the new one."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from antwort_grpc import pb
from antwort_grpc.storage.base import INTERRUPTED
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply, ScriptedToolCall
from tests.harness import function_tool, output_text, user
from tests.storage.processes import Stream, create, gateway_process, get, replica_gone

S = pb.ResponseStatus


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/gateway.db"
    url: str = request.getfixturevalue("postgres_url")
    return url


def weather_request() -> pb.CreateResponseRequest:
    request = user("Weather in Paris?")
    request.tools.append(function_tool("get_weather", city="string"))
    return request


async def test_a_gateway_killed_mid_stream_leaves_the_response_failed_interrupted_after_a_restart(
    store_url: str,
) -> None:
    replies = [
        Reply(text="Done quickly."),
        Reply(tool_calls=[ScriptedToolCall(name="get_weather", arguments='{"city": "Paris"}', id="call_1")]),
        Reply(text="word " * 400, delay=0.02),
        Reply(text="Sunny in Paris."),
    ]
    async with FakeOpenAI(*replies) as fake:
        async with gateway_process(store_url, fake.url) as first:
            completed = await create(first, user("quick one"))
            assert completed.status == S.RESPONSE_STATUS_COMPLETED
            paused = await create(first, weather_request())
            assert paused.status == S.RESPONSE_STATUS_REQUIRES_ACTION
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

            # The requires_action response of the killed process continues on the new one.
            follow = weather_request()
            follow.ClearField("input")
            follow.previous_response_id = paused.id
            follow.input_items.items.append(
                pb.Item(function_call_output=pb.FunctionCallOutput(call_id="call_1", output='{"temp_c": 21}'))
            )
            done = await create(second, follow)
            assert done.status == S.RESPONSE_STATUS_COMPLETED and output_text(done) == "Sunny in Paris."
            roles = [m["role"] for m in fake.chat_requests[-1]["messages"]]
            assert roles == ["user", "assistant", "tool"]
