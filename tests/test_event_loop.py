"""The service's processes run on uvloop unless ANTWORT_EVENT_LOOP says asyncio."""

from __future__ import annotations

import asyncio

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


async def test_the_suite_runs_on_the_loop_the_service_runs_on() -> None:
    expected = "asyncio" if event_loop.chosen() == "asyncio" else "uvloop"
    assert (await _loop_module()).startswith(expected)
