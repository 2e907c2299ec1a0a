"""Every SSE stream of the HTTP door ends as the spec asks: the terminal event, then the literal
`data: [DONE]` — a create's stream and an attach's (GET ?stream=true) alike."""

from __future__ import annotations

import aiohttp

from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply
from tests.http_harness import running_doors

MODEL = "fake-model"


async def _blocks(response: aiohttp.ClientResponse) -> list[str]:
    """The stream's events as their raw text blocks."""
    text = (await response.read()).decode()
    return [block for block in text.split("\n\n") if block]


async def test_a_created_stream_and_an_attached_one_end_with_done_after_the_terminal_event() -> None:
    async with FakeOpenAI(Reply(text="one two three")) as fake:
        provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model=MODEL))
        try:
            async with running_doors(provider=provider, store=MemoryStore(), model=MODEL) as doors:
                body = {"model": MODEL, "input": "Count.", "stream": True, "background": True}
                async with aiohttp.ClientSession() as session:
                    async with session.post(doors.url + "/v1/responses", json=body) as created:
                        blocks = await _blocks(created)
                    response_id = blocks[0].split('"id":"', 1)[1].split('"', 1)[0]
                    url = f"{doors.url}/v1/responses/{response_id}?stream=true&starting_after=2"
                    async with session.get(url) as attached:
                        again = await _blocks(attached)
        finally:
            await provider.aclose()
    for stream in (blocks, again):
        assert stream[-1] == "data: [DONE]"
        assert stream[-2].startswith("event: response.completed\n"), stream[-2]
        assert sum(block == "data: [DONE]" for block in stream) == 1
