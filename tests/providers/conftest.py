"""Fixtures: a fake OpenAI-compatible backend on a loopback port and providers pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.testing.fake_openai import FakeOpenAI

ProviderFactory = Callable[..., OpenAICompatProvider]


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as backend:
        yield backend


@pytest.fixture
async def make_provider() -> AsyncIterator[ProviderFactory]:
    made: list[OpenAICompatProvider] = []

    def build(url: str, **overrides: Any) -> OpenAICompatProvider:
        # Backoff in milliseconds keeps the retry tests fast; the policy is the same.
        options: dict[str, Any] = {"model": "fake-model", "backoff_base": 0.005, "backoff_cap": 0.02}
        options.update(overrides)
        provider = OpenAICompatProvider(BackendConfig(base_url=url, **options))
        made.append(provider)
        return provider

    yield build
    for provider in made:
        await provider.aclose()


@pytest.fixture
def provider(fake: FakeOpenAI, make_provider: ProviderFactory) -> OpenAICompatProvider:
    return make_provider(fake.url)
