"""Which provider `antwort-grpc serve` builds from its settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from antwort_grpc import pb
from antwort_grpc.config import GatewaySettings
from antwort_grpc.providers import factory, local_model
from antwort_grpc.providers.factory import NoBackendError, build_provider
from antwort_grpc.providers.local_model import LocalModelProvider
from antwort_grpc.providers.openai import OpenAICompatProvider
from antwort_grpc.providers.scripted import ScriptedProvider
from tests.harness import running_gateway, user

# How many of the latest requests a served script may still hold (none would do; a few is a bound too).
KEPT_BY_A_SERVED_SCRIPT = 4


@pytest.fixture(autouse=True)
def no_backend_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ANTWORT_BACKEND_URL", "ANTWORT_SCRIPT", "ANTWORT_MODEL"):
        monkeypatch.delenv(name, raising=False)


async def test_a_backend_url_selects_the_openai_compatible_provider() -> None:
    settings = GatewaySettings(backend_url="http://127.0.0.1:8000/v1/", model="m", backend_max_retries=5)
    provider = await build_provider(settings)
    assert isinstance(provider, OpenAICompatProvider)
    assert provider.config.chat_url == "http://127.0.0.1:8000/v1/chat/completions"
    assert provider.config.max_retries == 5


async def test_a_script_selects_the_scripted_provider(tmp_path: Path) -> None:
    script = tmp_path / "turns.json"
    script.write_text(json.dumps({"turns": [[{"text": "hi"}]]}))
    assert isinstance(await build_provider(GatewaySettings(script=script)), ScriptedProvider)


async def test_without_either_the_embedded_local_model_is_started() -> None:
    settings = GatewaySettings()
    provider = await build_provider(settings)
    try:
        assert isinstance(provider, LocalModelProvider)
        assert provider.model_name == settings.model == local_model.MODEL_NAME, "the default model"
        assert (await provider.check_health()).ok, "started and serving"
    finally:
        await provider.aclose()


async def test_without_the_local_model_the_error_says_what_to_configure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_model, "model_file", lambda: None)
    with pytest.raises(NoBackendError, match="ANTWORT_BACKEND_URL"):
        await factory.build_provider(GatewaySettings())


@pytest.mark.parametrize("script_turns", [{"turns": [[{"text": "hi"}]], "repeat": True}, {"tool_caller": {}}])
async def test_a_served_script_does_not_keep_the_requests_it_answered(
    tmp_path: Path, script_turns: dict[str, object]
) -> None:
    """`serve --script` runs for as long as a demo or a load test does: the inputs it answered must
    not pile up in the process (200 requests of 8 MB once held 2 GiB)."""
    script = tmp_path / "turns.json"
    script.write_text(json.dumps(script_turns))
    provider = await build_provider(GatewaySettings(script=script))
    assert isinstance(provider, ScriptedProvider)
    big = "x" * (256 * 1024)
    async with running_gateway(provider=provider) as gw:
        for _ in range(20):
            request = user(big)
            request.store = False
            response = await gw.create(request)
            assert response.status == pb.ResponseStatus.RESPONSE_STATUS_COMPLETED
    held = sum(r.items[-1].ByteSize() for r in provider.requests if r.items)
    assert held <= KEPT_BY_A_SERVED_SCRIPT * (len(big) + 64)
    assert len(provider.modes) <= KEPT_BY_A_SERVED_SCRIPT
