"""Backend failures: what is retried, what fails at once, and that nothing hangs."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import pytest

from antwort_grpc.providers.base import FinishReason, ProviderError
from antwort_grpc.providers.openai import OpenAICompatProvider
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply

from .turns import Drained, drain, turn


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def stream_error(provider: OpenAICompatProvider, into: Drained | None = None) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        await drain(provider, turn(), into)
    return caught.value


async def complete_error(provider: OpenAICompatProvider) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        await provider.complete(turn())
    return caught.value


async def test_429_is_retried_after_the_wait_the_backend_asks_for(
    fake: FakeOpenAI, provider: OpenAICompatProvider
) -> None:
    fake.add(Reply(status=429, headers={"Retry-After": "0.3"}), Reply(text="finally"))

    started = time.monotonic()
    out = await drain(provider, turn())

    assert out.text == "finally"
    assert time.monotonic() - started >= 0.3
    assert len(fake.chat_requests) == 2


async def test_429_asking_for_a_wait_beyond_the_bound_fails_at_once(fake: FakeOpenAI, make_provider: Any) -> None:
    provider = make_provider(fake.url, max_retry_after=5)
    fake.add(Reply(status=429, headers={"Retry-After": "60"}, error_message="slow down"))

    error = await complete_error(provider)

    assert error.code == "rate_limited" and "slow down" in error.message
    assert len(fake.chat_requests) == 1


@pytest.mark.parametrize("streaming", [True, False])
async def test_503_three_times_then_success(fake: FakeOpenAI, provider: OpenAICompatProvider, streaming: bool) -> None:
    fake.add(Reply(status=503, times=3), Reply(text="recovered"))

    if streaming:
        assert (await drain(provider, turn())).text == "recovered"
    else:
        assert (await provider.complete(turn())).items[0].message.content[0].output_text.text == "recovered"
    assert len(fake.chat_requests) == 4


@pytest.mark.parametrize("streaming", [True, False])
async def test_503_forever_fails_backend_unavailable_after_the_bound(
    fake: FakeOpenAI, provider: OpenAICompatProvider, streaming: bool
) -> None:
    fake.add(Reply(status=503, error_message="overloaded", times=100))

    error = await (stream_error(provider) if streaming else complete_error(provider))

    assert error.code == "backend_unavailable"
    assert "overloaded" in error.message and "4 attempts" in error.message
    assert len(fake.chat_requests) == 4  # the first try and max_retries=3 retries


async def test_connection_refused_fails_backend_unavailable(make_provider: Any) -> None:
    provider = make_provider(f"http://127.0.0.1:{free_port()}/v1", max_retries=1)

    error = await stream_error(provider)

    assert error.code == "backend_unavailable" and "cannot connect" in error.message


async def test_the_stream_cut_mid_answer_fails_after_the_partial_deltas(
    fake: FakeOpenAI, provider: OpenAICompatProvider
) -> None:
    fake.add(Reply(text="one two three four five", cut_after=3))
    partial = Drained()

    error = await stream_error(provider, partial)

    assert error.code == "backend_unavailable"
    assert partial.text == "one two "  # role chunk + two words, then the connection dropped
    assert partial.end is None
    assert len(fake.chat_requests) == 1, "no retry once tokens went out"


async def test_a_cut_before_the_first_token_is_retried(fake: FakeOpenAI, provider: OpenAICompatProvider) -> None:
    fake.add(Reply(text="lost", cut_after=1), Reply(text="second try"))

    assert (await drain(provider, turn())).text == "second try"
    assert len(fake.chat_requests) == 2


async def test_a_malformed_json_chunk_fails_backend_protocol_error(
    fake: FakeOpenAI, provider: OpenAICompatProvider
) -> None:
    fake.add(Reply(text="good then bad", malformed_at=2))
    partial = Drained()

    error = await stream_error(provider, partial)

    assert error.code == "backend_protocol_error" and "{not json" in error.message
    assert partial.text == "good "
    assert len(fake.chat_requests) == 1


async def test_a_malformed_non_streaming_answer_fails_backend_protocol_error(
    fake: FakeOpenAI, provider: OpenAICompatProvider
) -> None:
    fake.add(Reply(text="x", malformed_at=0))

    error = await complete_error(provider)

    assert error.code == "backend_protocol_error"
    assert len(fake.chat_requests) == 1


async def test_an_answer_that_is_not_sse_is_a_protocol_error_not_a_hang(
    fake: FakeOpenAI, provider: OpenAICompatProvider
) -> None:
    fake.add(Reply(raw=["not json at all"]))

    error = await stream_error(provider)

    assert error.code == "backend_protocol_error"


async def test_a_stream_that_ends_without_finishing_is_a_protocol_error(
    fake: FakeOpenAI, provider: OpenAICompatProvider
) -> None:
    fake.add(Reply(raw=['{"choices":[{"index":0,"delta":{"content":"hal"}}]}'], send_done=False))

    error = await stream_error(provider)

    assert error.code == "backend_protocol_error"


async def test_an_error_inside_the_stream_fails_the_turn(fake: FakeOpenAI, provider: OpenAICompatProvider) -> None:
    fake.add(Reply(raw=['{"error":{"message":"context too long","code":400}}']))

    error = await stream_error(provider)

    assert error.code == "invalid_request" and "context too long" in error.message


@pytest.mark.parametrize(
    ("reply", "code", "words"),
    [
        (Reply(status=400, error_message="bad temperature"), "invalid_request", "bad temperature"),
        (Reply(status=401, error_message="Incorrect API key"), "backend_auth", "ANTWORT_BACKEND_API_KEY"),
        (Reply(status=403), "backend_auth", "credentials"),
        (Reply(status=404, error_message="The model `m` does not exist."), "model_not_found", "fake-model"),
        (Reply(status=422, error_message="bad field"), "invalid_request", "bad field"),
    ],
)
async def test_client_errors_fail_at_once_with_their_code(
    fake: FakeOpenAI, provider: OpenAICompatProvider, reply: Reply, code: str, words: str
) -> None:
    fake.add(reply, reply)

    for error in (await stream_error(provider), await complete_error(provider)):
        assert error.code == code and words in error.message
    assert len(fake.chat_requests) == 2, "never retried"


async def test_an_unknown_model_is_model_not_found(make_provider: Any) -> None:
    async with FakeOpenAI(Reply(text="x"), models=["llama"]) as fake:
        provider = make_provider(fake.url)
        with pytest.raises(ProviderError) as caught:
            await drain(provider, turn(model="gpt-9"))
    error = caught.value
    assert error.code == "model_not_found" and "gpt-9" in error.message


async def test_a_wrong_api_key_names_the_backends_auth(make_provider: Any) -> None:
    async with FakeOpenAI(Reply(text="x"), api_key="right") as fake:
        error = await complete_error(make_provider(fake.url, api_key="wrong"))
    assert error.code == "backend_auth" and fake.url in error.message


async def test_cancelling_the_caller_cancels_the_backend_request(
    fake: FakeOpenAI, provider: OpenAICompatProvider
) -> None:
    fake.add(Reply(text="slow " * 50, delay=10, delay_from=3))
    first_token = asyncio.Event()

    async def consume() -> None:
        async for _ in provider.stream(turn()):
            first_token.set()

    task = asyncio.create_task(consume())
    await first_token.wait()
    task.cancel()
    started = time.monotonic()

    await fake.wait_for_disconnect(timeout=2)

    assert time.monotonic() - started < 1
    assert fake.in_flight == 0
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_caller_that_stops_reading_closes_the_backend_request(
    fake: FakeOpenAI, provider: OpenAICompatProvider
) -> None:
    fake.add(Reply(text="slow " * 50, delay=10, delay_from=3))
    stream = provider.stream(turn())

    await anext(stream)
    await stream.aclose()

    await fake.wait_for_disconnect(timeout=1)


async def test_cancelling_while_the_backend_has_not_answered_yet_cancels_the_request(
    fake: FakeOpenAI, provider: OpenAICompatProvider
) -> None:
    fake.add(Reply(text="never", first_delay=30))
    task = asyncio.create_task(provider.complete(turn()))
    await fake.wait_for_requests(1)
    task.cancel()

    await fake.wait_for_disconnect(timeout=2)

    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_silent_backend_hits_the_read_timeout(fake: FakeOpenAI, make_provider: Any) -> None:
    provider = make_provider(fake.url, read_timeout=0.2, max_retries=0)
    fake.add(Reply(text="a b c", delay=5))
    partial = Drained()

    error = await stream_error(provider, partial)

    assert error.code == "backend_unavailable" and "0.2 s" in error.message
    assert partial.text == ""  # the role chunk came, then silence
    await fake.wait_for_disconnect(timeout=2)


async def test_finish_reason_length_after_a_retry_still_reaches_the_engine(
    fake: FakeOpenAI, provider: OpenAICompatProvider
) -> None:
    fake.add(Reply(status=502), Reply(text="trunc", finish_reason="length"))

    assert (await drain(provider, turn())).finish is FinishReason.LENGTH
