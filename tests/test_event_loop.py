"""The service's processes run on uvloop unless ANTWORT_EVENT_LOOP says asyncio."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from antwort_grpc import event_loop


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_the_default_loop_is_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(event_loop.SETTING, raising=False)
    assert event_loop.run(_loop_module()).startswith("uvloop")


def test_the_setting_chooses_the_standard_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(event_loop.SETTING, "asyncio")
    assert event_loop.run(_loop_module()).startswith("asyncio")


async def test_a_served_gateway_runs_on_uvloop_by_default(tmp_path: Path) -> None:
    """What ships: `serve` with a backend starts no process and runs on uvloop; the one with the
    embedded local model (a process it starts) on the standard loop."""
    from antwort_grpc.cli import _loop_for
    from antwort_grpc.config import GatewaySettings

    assert _loop_for(GatewaySettings(backend_url="http://127.0.0.1:1/v1")) is None
    assert _loop_for(GatewaySettings(script=tmp_path / "turns.json")) is None
    assert _loop_for(GatewaySettings()) == "asyncio"
