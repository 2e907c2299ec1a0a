"""Hooks are configured like executors: repeated `--hook` flags or comma-separated ANTWORT_HOOKS,
each with its own timeout and failure policy; a bad entry stops the gateway with one line."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from antwort_grpc.cli import gateway_settings
from antwort_grpc.config import GatewaySettings
from antwort_grpc.hooks import LocalHook, RemoteHook, build_hooks

ROOT = Path(__file__).resolve().parents[2]
ANTWORT = str(Path(sys.executable).parent / "antwort-grpc")


def test_hooks_come_from_a_comma_separated_variable_or_repeated_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTWORT_HOOKS", "127.0.0.1:50071;failure=open, examples.redact_hook:DenyAndRedact")
    monkeypatch.setenv("ANTWORT_HOOK_TIMEOUT", "0.25")
    settings = GatewaySettings()
    assert settings.hooks == ["127.0.0.1:50071;failure=open", "examples.redact_hook:DenyAndRedact"]
    hooks = build_hooks(settings.hooks, settings.hook_timeout, settings.hook_failure == "open")
    assert isinstance(hooks[0], RemoteHook) and hooks[0].fail_open and hooks[0].timeout == 0.25
    assert isinstance(hooks[1], LocalHook) and not hooks[1].fail_open, "closed is the default"
    flags = gateway_settings(argparse.Namespace(hooks=["a:1", "b:2;timeout=2"]))
    assert flags.hooks == ["a:1", "b:2;timeout=2"], "flags win over the environment"


@pytest.mark.parametrize(
    ("hook", "says"),
    [
        ("127.0.0.1:1;retries=3", "unknown option 'retries=3'"),
        ("127.0.0.1:1;timeout=0", "timeout must be more than 0"),
        ("tests.hooks.nowhere:Hook", "cannot load hook tests.hooks.nowhere:Hook"),
    ],
)
def test_a_bad_hook_entry_stops_the_gateway_with_one_line(hook: str, says: str, tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text('{"turns": [[{"text": "hi"}]]}')
    run = subprocess.run(
        [ANTWORT, "serve", "--listen", "127.0.0.1:0", "--store", "memory", "--script", str(script), "--hook", hook],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    [line] = run.stderr.strip().splitlines()
    assert line.startswith("antwort-grpc serve: --hook / ANTWORT_HOOKS: ") and says in line
