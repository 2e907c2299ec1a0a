"""The sandbox executor service as a real process (`antwort-grpc executor sandbox`), driven through
the ToolExecutorService gRPC API on a loopback port: code runs and its results come back; code that
misbehaves is contained, reported as an is_error result, and the sandbox serves the next call.

Two services run: one with the isolation this machine allows (namespaces here), one forced into
the fallback (no namespaces: seccomp, Landlock and rlimits only), as in a pod that forbids unshare.
The limits are small so that the whole module takes seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from antwort_grpc import pb

ROOT = Path(__file__).resolve().parents[2]
SECRET_NAME = "ANTWORT_TEST_SANDBOX_SECRET"
SECRET = "s3cr3t-that-the-code-must-never-see"
TIMEOUT = 2.0
OUTPUT_CAP = 64 * 1024
# Root hands the code to uid 65534, which cannot reach an interpreter under /root (pyenv, say):
# the system one can be run by anyone.
PYTHON = "/usr/bin/python3" if os.geteuid() == 0 else sys.executable


def uid_process_budget(extra: int = 64) -> str:
    """MAX_PROCESSES for a service on this test run's own (non-root) uid without namespaces: there
    the process limit counts every process and thread of the uid, this test run's included."""
    uid, count = os.getuid(), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/{pid}").st_uid == uid:
                count += len(os.listdir(f"/proc/{pid}/task"))
    return str(count + extra)


@dataclass
class Sandbox:
    target: str
    pid: int
    workdir_root: Path
    log: Path


def _start(tmp: Path, name: str, wrapper: Sequence[str] = (), **settings: str) -> Iterator[Sandbox]:
    """The service as a process (started through `wrapper`, a command that execs the rest), once
    it is serving."""
    # Under /tmp as the service's default is: pytest's own temp base is closed to the uid the code
    # runs as when the tests run as root.
    workdir_root = Path(tempfile.mkdtemp(prefix=f"antwort-sandbox-test-{name}-"))
    workdir_root.chmod(0o755)
    log = tmp / f"{name}.log"
    if os.geteuid() != 0 and not wrapper and settings.get("namespaces") == "off":
        settings.setdefault("max_processes", uid_process_budget())
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        SECRET_NAME: SECRET,
        "ANTWORT_EXECUTOR_LISTEN": "127.0.0.1:0",
        "ANTWORT_SANDBOX_PYTHON": PYTHON,
        "ANTWORT_SANDBOX_TIMEOUT_SECONDS": str(TIMEOUT),
        "ANTWORT_SANDBOX_CPU_SECONDS": "1",
        "ANTWORT_SANDBOX_MEMORY_MB": "256",
        "ANTWORT_SANDBOX_MAX_PROCESSES": "16",
        "ANTWORT_SANDBOX_MAX_FILE_SIZE_MB": "1",
        "ANTWORT_SANDBOX_MAX_OUTPUT_BYTES": str(OUTPUT_CAP),
        "ANTWORT_SANDBOX_WORKDIR_ROOT": str(workdir_root),
        **{f"ANTWORT_SANDBOX_{k.upper()}": v for k, v in settings.items()},
    }
    cli = [*wrapper, sys.executable, "-m", "antwort_grpc.cli", "executor", "sandbox"]
    with log.open("wb") as err:
        proc = subprocess.Popen(cli, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert "serving on" in line, log.read_text()
        yield Sandbox(line.rsplit(" ", 1)[-1].strip(), proc.pid, workdir_root, log)
    finally:
        proc.terminate()
        assert proc.wait(15) == 0
        shutil.rmtree(workdir_root)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    yield from _start(tmp_path_factory.mktemp("sandbox"), "auto")


@pytest.fixture(scope="module")
def fallback(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    yield from _start(tmp_path_factory.mktemp("sandbox"), "fallback", namespaces="off")


@pytest.fixture(scope="module")
def cpu_bound(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """A wall-clock timeout far beyond the CPU limit, so that on a busy machine the CPU limit is
    still what stops the code."""
    yield from _start(tmp_path_factory.mktemp("sandbox"), "cpu", timeout_seconds="60")


@pytest.fixture(scope="module")
def single_slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    yield from _start(tmp_path_factory.mktemp("sandbox"), "single", max_concurrency="1")


async def _stub(box: Sandbox) -> AsyncIterator[pb.ToolExecutorServiceStub]:
    async with grpc.aio.insecure_channel(box.target) as channel:
        yield pb.ToolExecutorServiceStub(channel)


@pytest.fixture
async def stub(sandbox: Sandbox) -> AsyncIterator[pb.ToolExecutorServiceStub]:
    async for s in _stub(sandbox):
        yield s


@pytest.fixture
async def fallback_stub(fallback: Sandbox) -> AsyncIterator[pb.ToolExecutorServiceStub]:
    async for s in _stub(fallback):
        yield s


@dataclass
class Result:
    is_error: bool
    output: dict[str, Any]
    raw: str
    progress: list[str]


def _request(code: str, call_id: str = "call_1") -> pb.ExecuteRequest:
    call = pb.FunctionCall(call_id=call_id, name="run_python", arguments=json.dumps({"code": code}))
    return pb.ExecuteRequest(call=call, tool=pb.Tool(code_interpreter=pb.CodeInterpreterTool()))


async def run(stub: pb.ToolExecutorServiceStub, code: str) -> Result:
    updates = [u async for u in stub.Execute(_request(code), timeout=30)]
    assert [u.WhichOneof("update") for u in updates][-1] == "result"
    result = updates[-1].result
    assert result.call_id == "call_1"
    return Result(result.is_error, json.loads(result.output), result.output, [u.progress.message for u in updates[:-1]])


@pytest.fixture
def open_to_all(tmp_path: Path) -> Path:
    """A world-writable directory: only the sandbox stands between the code and it."""
    target = tmp_path / "open-to-all"
    target.mkdir()
    target.chmod(0o777)
    return target


def entries(path: Path) -> list[str]:
    return os.listdir(path)


def leftover_processes(box: Sandbox) -> list[int]:
    """Processes still working in one of the sandbox's call directories."""
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if cwd.startswith(str(box.workdir_root)):
            left.append(int(pid))
    return left


async def assert_contained(stub: pb.ToolExecutorServiceStub, box: Sandbox, result: Result) -> None:
    """The call is an error for the model, nothing of it is left behind, and the next call works."""
    assert result.is_error, result.output
    assert result.output["error"]
    assert SECRET not in result.raw
    assert leftover_processes(box) == []
    assert entries(box.workdir_root) == []
    after = await run(stub, "print(6 * 7)")
    assert (after.is_error, after.output["stdout"], after.output["exit_code"]) == (False, "42\n", 0), after.raw


# What the service offers.


async def test_the_sandbox_offers_run_python_and_claims_code_interpreter(stub: pb.ToolExecutorServiceStub) -> None:
    info = await stub.GetExecutorInfo(pb.GetExecutorInfoRequest())
    assert (info.kind, info.name) == (pb.ToolKind.TOOL_KIND_SANDBOX, "sandbox")
    assert [t.function.name for t in info.tools] == ["run_python"]
    schema = info.tools[0].function.parameters
    assert schema["required"] == ["code"] and schema["properties"]["code"]["type"] == "string"
    assert "no network" in info.tools[0].function.description
    code_interpreter = pb.Tool(code_interpreter=pb.CodeInterpreterTool())
    assert (await stub.CanExecute(pb.CanExecuteRequest(tool=code_interpreter))).can_execute
    other = pb.Tool(function=pb.FunctionTool(name="get_weather"))
    assert not (await stub.CanExecute(pb.CanExecuteRequest(tool=other))).can_execute


def test_the_active_isolation_is_logged_at_startup(sandbox: Sandbox, fallback: Sandbox) -> None:
    assert "sandbox isolation: network: namespace+seccomp; namespaces: user,net,pid,mount,ipc,uts" in (
        sandbox.log.read_text()
    )
    assert "sandbox isolation: network: seccomp; namespaces: off (fallback)" in fallback.log.read_text()


# Code that behaves.


async def test_code_that_prints_returns_stdout_and_exit_code_zero(stub: pb.ToolExecutorServiceStub) -> None:
    result = await run(stub, "import sys\nprint('hello from the sandbox')\nprint('a warning', file=sys.stderr)")
    assert not result.is_error
    out = result.output
    assert (out["exit_code"], out["signal"], out["limit"], out["error"]) == (0, None, None, None)
    assert (out["stdout"], out["stderr"]) == ("hello from the sandbox\n", "a warning\n")
    assert out["files"] == []
    assert result.progress == ["started", "exited 0"]


async def test_files_the_code_writes_are_returned(stub: pb.ToolExecutorServiceStub) -> None:
    code = (
        "import os\n"
        "os.makedirs('out', exist_ok=True)\n"
        "open('out/result.csv', 'w').write('a,b\\n1,2\\n')\n"
        "open('image.bin', 'wb').write(bytes([0, 255, 1]))\n"
        "os.symlink('/etc/passwd', 'link')\n"
    )
    result = await run(stub, code)
    assert not result.is_error, result.output
    assert result.output["files"] == [
        {"path": "image.bin", "size": 3, "encoding": "base64", "content": "AP8B"},
        {"path": "out/result.csv", "size": 8, "encoding": "utf-8", "content": "a,b\n1,2\n"},
    ]


async def test_each_call_starts_in_a_fresh_empty_directory(stub: pb.ToolExecutorServiceStub) -> None:
    await run(stub, "open('left.txt', 'w').write('from the first call')")
    result = await run(stub, "import os; print(sorted(os.listdir('.')))")
    assert result.output["stdout"] == "[]\n"


async def test_code_that_fails_is_an_error_with_its_traceback(stub: pb.ToolExecutorServiceStub) -> None:
    result = await run(stub, "raise ValueError('bad input')")
    assert result.is_error
    assert result.output["exit_code"] == 1
    assert "ValueError: bad input" in result.output["stderr"]
    assert result.output["error"] == "the code exited with status 1"


async def test_arguments_without_code_are_an_error_result(stub: pb.ToolExecutorServiceStub) -> None:
    call = pb.FunctionCall(call_id="call_1", name="run_python", arguments='{"source": "print(1)"}')
    updates = [u async for u in stub.Execute(pb.ExecuteRequest(call=call))]
    assert updates[-1].result.is_error
    assert '"code"' in updates[-1].result.output


async def test_a_lone_surrogate_in_the_code_is_an_error_result_and_one_log_line(
    stub: pb.ToolExecutorServiceStub, sandbox: Sandbox
) -> None:
    """JSON may escape half of a UTF-16 pair ("\\ud800"); no UTF-8 exists for it."""
    call = pb.FunctionCall(call_id="call_surrogate", name="run_python", arguments='{"code": "print(1) # \\ud800"}')
    updates = [u async for u in stub.Execute(pb.ExecuteRequest(call=call))]
    result = updates[-1].result
    assert result.is_error
    assert result.output == '"code" is not valid Unicode text: it holds a lone surrogate (\\ud800 at character 11)'
    lines = [line for line in sandbox.log.read_text().splitlines() if "call_surrogate" in line]
    assert len(lines) == 1 and "refused" in lines[0], lines
    assert "Traceback" not in sandbox.log.read_text()


async def test_a_file_whose_name_is_not_utf8_is_listed_with_replacement_characters(
    stub: pb.ToolExecutorServiceStub,
) -> None:
    result = await run(stub, "open(b'caf\\xe9.txt', 'w').write('latin-1 name')")
    assert not result.is_error, result.output
    assert [(f["path"], f["content"]) for f in result.output["files"]] == [("caf\ufffd.txt", "latin-1 name")]


# Containment, with the isolation this machine allows.


async def test_code_that_opens_a_socket_gets_no_network(stub: pb.ToolExecutorServiceStub, sandbox: Sandbox) -> None:
    port = int(sandbox.target.rsplit(":", 1)[1])
    code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')"
    result = await run(stub, code)
    assert "connected" not in result.output["stdout"]
    assert "PermissionError" in result.output["stderr"]
    await assert_contained(stub, sandbox, result)


async def test_code_cannot_read_the_services_environment(stub: pb.ToolExecutorServiceStub, sandbox: Sandbox) -> None:
    result = await run(stub, f"import os\nprint(sorted(os.environ))\nprint(os.environ[{SECRET_NAME!r}])")
    assert "KeyError" in result.output["stderr"]
    assert result.output["stdout"] == "['LC_CTYPE']\n"  # set by the interpreter itself (PEP 538)
    await assert_contained(stub, sandbox, result)
    result = await run(stub, f"print(open('/proc/{sandbox.pid}/environ').read())")
    assert "Error" in result.output["stderr"]
    await assert_contained(stub, sandbox, result)


async def test_a_fork_bomb_is_contained(stub: pb.ToolExecutorServiceStub, sandbox: Sandbox) -> None:
    result = await run(stub, "import os\nwhile True:\n    os.fork()")
    assert "BlockingIOError" in result.output["stderr"] or result.output["limit"] == "timeout"
    await assert_contained(stub, sandbox, result)


async def test_allocating_2_gib_fails_within_the_memory_limit(
    stub: pb.ToolExecutorServiceStub, sandbox: Sandbox
) -> None:
    result = await run(stub, "block = bytearray(2 * 1024**3)\nprint('allocated')")
    assert result.output["stdout"] == ""
    assert "MemoryError" in result.output["stderr"]
    await assert_contained(stub, sandbox, result)


async def test_printing_100_mb_stops_at_the_output_cap(stub: pb.ToolExecutorServiceStub, sandbox: Sandbox) -> None:
    result = await run(stub, "import sys\nchunk = 'x' * 1024 * 1024\nfor _ in range(100):\n    sys.stdout.write(chunk)")
    out = result.output
    assert (out["limit"], out["stdout_truncated"], out["signal"]) == ("output", True, "SIGKILL")
    assert out["stdout"] == "x" * OUTPUT_CAP
    await assert_contained(stub, sandbox, result)


async def test_writing_outside_its_directory_is_denied(
    stub: pb.ToolExecutorServiceStub, sandbox: Sandbox, open_to_all: Path
) -> None:
    for path in (str(open_to_all / "escaped.txt"), "../escaped.txt", "/tmp/escaped-from-the-sandbox.txt"):
        result = await run(stub, f"open({path!r}, 'w').write('out')")
        assert "PermissionError" in result.output["stderr"]
        await assert_contained(stub, sandbox, result)
    assert entries(open_to_all) == []
    assert "escaped-from-the-sandbox.txt" not in entries(Path("/tmp"))


async def test_writing_a_file_over_the_size_limit_is_stopped(
    stub: pb.ToolExecutorServiceStub, sandbox: Sandbox
) -> None:
    result = await run(stub, "open('big.bin', 'wb').write(b'0' * 2 * 1024 * 1024)")
    # Python ignores SIGXFSZ, so the write fails instead of the process being killed.
    assert "OSError: [Errno 27] File too large" in result.output["stderr"]
    assert result.output["files"] == [
        {
            "path": "big.bin",
            "size": 1024 * 1024,
            "omitted": "larger than what is left of the size budget for returned files",
        }
    ]
    await assert_contained(stub, sandbox, result)


async def test_code_that_sleeps_forever_is_killed_at_the_timeout(
    stub: pb.ToolExecutorServiceStub, sandbox: Sandbox
) -> None:
    result = await run(stub, "import subprocess, time\nsubprocess.Popen(['sleep', '1000'])\ntime.sleep(1000)")
    out = result.output
    assert (out["limit"], out["signal"], out["exit_code"]) == ("timeout", "SIGKILL", None)
    assert TIMEOUT * 1000 <= out["duration_ms"] < TIMEOUT * 1000 + 5000
    assert result.progress == ["started", "stopped: timeout limit"]
    await assert_contained(stub, sandbox, result)


async def test_burning_cpu_stops_at_the_cpu_limit(cpu_bound: Sandbox) -> None:
    async for stub in _stub(cpu_bound):
        result = await run(stub, "while True:\n    pass")
        assert (result.output["limit"], result.output["signal"]) == ("cpu", "SIGXCPU")
        await assert_contained(stub, cpu_bound, result)


# Containment in the fallback: no namespaces, as in a pod that forbids them.


async def test_fallback_code_that_opens_a_socket_gets_no_network(
    fallback_stub: pb.ToolExecutorServiceStub, fallback: Sandbox
) -> None:
    for family in ("AF_INET", "AF_INET6", "AF_UNIX"):
        result = await run(fallback_stub, f"import socket\nsocket.socket(socket.{family})\nprint('opened')")
        assert result.output["stdout"] == ""
        assert "PermissionError" in result.output["stderr"]
        await assert_contained(fallback_stub, fallback, result)


async def test_fallback_code_cannot_read_the_services_environment_or_signal_it(
    fallback_stub: pb.ToolExecutorServiceStub, fallback: Sandbox
) -> None:
    result = await run(fallback_stub, f"import os\nprint(os.environ.get({SECRET_NAME!r}))\nos.getppid()")
    assert result.output["stdout"] == "None\n"
    for code in (
        f"print(open('/proc/{fallback.pid}/environ').read())",
        f"import os\nos.kill({fallback.pid}, 9)",
        "import os\nos.kill(-1, 0)",  # signal 0 to every process it may signal: the keeper at least
    ):
        result = await run(fallback_stub, code)
        assert "PermissionError" in result.output["stderr"]
        await assert_contained(fallback_stub, fallback, result)


async def test_fallback_writing_outside_its_directory_is_denied(
    fallback_stub: pb.ToolExecutorServiceStub, fallback: Sandbox, open_to_all: Path
) -> None:
    result = await run(fallback_stub, f"open({str(open_to_all / 'escaped.txt')!r}, 'w').write('out')")
    assert "PermissionError" in result.output["stderr"]
    await assert_contained(fallback_stub, fallback, result)
    assert entries(open_to_all) == []


async def test_fallback_processes_the_code_leaves_behind_are_killed(
    fallback_stub: pb.ToolExecutorServiceStub, fallback: Sandbox
) -> None:
    code = (
        "import os, subprocess\n"
        "subprocess.Popen(['sleep', '1000'])\n"
        "try:\n    os.setsid()\nexcept OSError as e:\n    print(e)"
    )
    result = await run(fallback_stub, code)
    assert result.output["stdout"] == "[Errno 1] Operation not permitted\n"
    assert leftover_processes(fallback) == []
    result = await run(fallback_stub, "import time\ntime.sleep(1000)")
    assert result.output["limit"] == "timeout"
    await assert_contained(fallback_stub, fallback, result)


# Concurrency.


async def test_calls_beyond_the_concurrency_limit_are_resource_exhausted(single_slot: Sandbox) -> None:
    async for stub in _stub(single_slot):
        first = stub.Execute(_request("import time\ntime.sleep(1000)"))
        assert (await first.read()).progress.message == "started"
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in stub.Execute(_request("print(1)", call_id="call_2")):
                pass
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "sandbox busy" in (refused.value.details() or "")
        status = rpc_status.from_call(refused.value)
        assert status is not None
        info = error_details_pb2.ErrorInfo()
        assert status.details[0].Unpack(info) and info.reason == "sandbox_busy"
        # The slot is free again once the first call has ended (here at its timeout).
        updates = []
        while (update := await first.read()) != grpc.aio.EOF:
            updates.append(update)
        assert json.loads(updates[-1].result.output)["limit"] == "timeout"
        result = await run(stub, "print('next')")
        assert result.output["stdout"] == "next\n"


# Refusing to start.


def test_the_service_refuses_to_start_when_it_cannot_run_code(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ANTWORT_SANDBOX_PYTHON": str(tmp_path / "no-python")}
    cli = [sys.executable, "-m", "antwort_grpc.cli", "executor", "sandbox", "--listen", "127.0.0.1:0"]
    done = subprocess.run(cli, cwd=ROOT, env=env, capture_output=True, timeout=60)
    assert done.returncode != 0
    assert b"no-python" in done.stderr
