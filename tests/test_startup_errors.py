"""Every startup failure of the real commands is one line naming the setting to change, a non-zero
exit, and no traceback unless the log level is DEBUG."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ANTWORT = str(Path(sys.executable).parent / "antwort-grpc")


# A command that gets as far as listening listens on a free port, and keeps its files out of the
# checkout: the failure under test is the one reported even while `make run` (127.0.0.1:50051,
# var/) is up, or an executor or hook on its default port.
ANYWHERE = {
    "ANTWORT_LISTEN": "127.0.0.1:0",
    "ANTWORT_HTTP_LISTEN": "127.0.0.1:0",
    "ANTWORT_EXECUTOR_LISTEN": "127.0.0.1:0",
    "ANTWORT_HOOK_LISTEN": "127.0.0.1:0",
}


def run(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ANTWORT_")}
    environment.update(ANYWHERE)
    return subprocess.run(
        [ANTWORT, *args], capture_output=True, text=True, timeout=60, cwd=cwd, env={**environment, **(env or {})}
    )


@pytest.fixture(autouse=True)
def _out_of_the_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ANYWHERE, "ANTWORT_DATA_DIR", str(tmp_path / "var"))


def assert_one_line(result: subprocess.CompletedProcess[str], *names: str) -> str:
    assert result.returncode != 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "turns.json"
    path.write_text(json.dumps({"turns": [[{"text": "hi"}]]}))
    return path


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_the_fake_backends_script_given_to_serve_says_which_file_format_it_is() -> None:
    line = assert_one_line(
        run("serve", "--store", "memory", "--script", "scripts/demo_script.json"), "--script / ANTWORT_SCRIPT"
    )
    assert 'has no "turns" list' in line and "fake_openai --script" in line


def test_a_missing_script_file_is_one_line(tmp_path: Path) -> None:
    line = assert_one_line(run("serve", "--script", str(tmp_path / "nope.json")), "--script / ANTWORT_SCRIPT")
    assert "No such file" in line


def test_a_malformed_turn_names_its_number(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"turns": [[{"text": "ok"}], [{"tool_call": {"arguments": {}}}]]}))
    line = assert_one_line(run("serve", "--store", "memory", "--script", str(bad)), "--script / ANTWORT_SCRIPT")
    assert "turn 2" in line


def test_a_port_in_use_names_the_listen_setting(script: Path, busy_port: int) -> None:
    line = assert_one_line(
        run("serve", "--store", "memory", "--script", str(script), "--listen", f"127.0.0.1:{busy_port}"),
        "--listen / ANTWORT_LISTEN",
    )
    assert "in use" in line


def test_an_executor_on_a_port_in_use_names_its_listen_setting(busy_port: int) -> None:
    result = run("executor", "run", "examples.weather_executor:Weather", "--listen", f"127.0.0.1:{busy_port}")
    assert_one_line(result, "--listen / ANTWORT_EXECUTOR_LISTEN")


def test_a_store_locked_by_another_gateway_names_the_store_setting(script: Path, tmp_path: Path) -> None:
    first = subprocess.Popen(
        [ANTWORT, "serve", "--script", str(script), "--data-dir", str(tmp_path), "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert first.stdout is not None and "serving on" in first.stdout.readline()
        result = run("serve", "--script", str(script), "--data-dir", str(tmp_path), "--listen", "127.0.0.1:0")
    finally:
        first.terminate()
        first.wait(timeout=30)
    line = assert_one_line(result, "--store / ANTWORT_STORE")
    assert "used by another antwort-grpc process" in line


@pytest.mark.parametrize(
    ("env", "args", "names"),
    [
        ({"ANTWORT_MAX_TURNS": "many"}, [], ["--max-turns / ANTWORT_MAX_TURNS", "'many'"]),
        ({}, ["--max-turns", "x"], []),  # argparse's own one-line usage error
        ({"ANTWORT_SHUTDOWN_GRACE": "soon"}, [], ["ANTWORT_SHUTDOWN_GRACE", "'soon'"]),
        ({}, ["--log-level", "LOUD"], ["--log-level / ANTWORT_LOG_LEVEL", "'LOUD'"]),
        ({}, ["--store", "mysql://db"], ["--store / ANTWORT_STORE", "unsupported store"]),
        ({}, ["--listen", "nowhere"], ["--listen / ANTWORT_LISTEN", "not host:port"]),
        ({"ANTWORT_BACKEND_HEADERS": "{bad"}, [], ["ANTWORT_BACKEND_HEADERS", "not valid JSON", "a JSON object"]),
    ],
)
def test_a_bad_config_value_names_the_setting(
    script: Path, env: dict[str, str], args: list[str], names: list[str]
) -> None:
    result = run("serve", "--script", str(script), *args, env=env)
    if names:
        assert_one_line(result, *names)
    else:
        assert result.returncode != 0 and "Traceback" not in result.stderr


def test_another_model_name_on_the_embedded_model_is_refused_at_startup() -> None:
    line = assert_one_line(run("serve", "--store", "memory", "--model", "gpt-4o"), "--model / ANTWORT_MODEL")
    assert "smollm2-135m-instruct" in line and "ANTWORT_BACKEND_URL" in line


def test_an_executor_class_that_does_not_import_says_where_to_run_from(tmp_path: Path) -> None:
    line = assert_one_line(run("executor", "run", "examples.weather_executor:Weather", cwd=tmp_path))
    assert "No module named 'examples'" in line and "run from the directory that holds examples" in line


def test_debug_log_level_shows_the_traceback(tmp_path: Path) -> None:
    result = run("serve", "--script", str(tmp_path / "nope.json"), "--log-level", "DEBUG")
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "ScriptError" in result.stderr


def test_the_executor_command_imports_examples_from_the_directory_it_runs_in() -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ANTWORT_")}
    command = [ANTWORT, "executor", "run", "examples.weather_executor:Weather", "--listen", "127.0.0.1:0"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=environment)
    try:
        assert process.stdout is not None
        assert "antwort-grpc executor weather serving on" in process.stdout.readline()
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.parametrize("command", [["serve"], ["executor", "run", "examples.weather_executor:Weather"]])
def test_an_unknown_event_loop_names_the_setting(command: list[str], script: Path) -> None:
    extra = ["--script", str(script)] if command == ["serve"] else []
    line = assert_one_line(run(*command, *extra, env={"ANTWORT_EVENT_LOOP": "trio"}), "ANTWORT_EVENT_LOOP", "trio")
    assert "uvloop" in line
