"""The chunk formats of vLLM, Ollama and llama.cpp's server (each fixture names its source), played
over real HTTP by the fake backend and translated by the provider."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from antwort_grpc import pb
from antwort_grpc.providers.base import FinishReason, TextDelta
from antwort_grpc.providers.openai import OpenAICompatProvider
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply

from .turns import drain, turn

FIXTURES = Path(__file__).parent / "fixtures"


def scenarios() -> list[Any]:
    cases = []
    for path in sorted(FIXTURES.glob("*.json")):
        fixture = json.loads(path.read_text())
        assert fixture["source"], f"{path.name} must name its source"
        for scenario in fixture["scenarios"]:
            cases.append(pytest.param(scenario, id=f"{fixture['backend']}: {scenario['name']}"))
    return cases


@pytest.mark.parametrize("scenario", scenarios())
async def test_backend_chunk_format(scenario: dict[str, Any], fake: FakeOpenAI, provider: OpenAICompatProvider) -> None:
    events = scenario["events"]
    assert events[-1] == "[DONE]"
    fake.add(Reply(raw=events[:-1]))
    expect = scenario["expect"]

    out = await drain(provider, turn())

    assert out.text == expect["text"]
    assert not any(isinstance(e, TextDelta) and not e.text for e in out.events), "no empty text deltas"
    assert out.reasoning == expect["reasoning"]
    assert [[c.call_id, c.name, c.arguments] for c in out.calls] == expect["calls"]
    assert out.finish is FinishReason(expect["finish"])
    prompt, completion, total = expect["usage"]
    assert out.end is not None
    assert out.end.usage == pb.Usage(input_tokens=prompt, output_tokens=completion, total_tokens=total)
