"""The sandbox executor service: `run_python`, offered to requests that ask for `code_interpreter`."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import shutil

import grpc

from antwort_grpc import pb
from antwort_grpc.errors import RequestError
from antwort_grpc.executors.base import ProgressSink
from antwort_grpc.tool_services.sandbox.cgroup import CallCgroups, delegate
from antwort_grpc.tool_services.sandbox.isolation import (
    SYSTEM_READ_PATHS,
    Isolation,
    interpreter_prefixes,
    keeper_signals,
    landlock_abi,
    make_undumpable,
    test_only_switches,
)
from antwort_grpc.tool_services.sandbox.limits import Limits
from antwort_grpc.tool_services.sandbox.runner import FilePolicy, Runner
from antwort_grpc.tool_services.sandbox.settings import SandboxSettings
from antwort_grpc.tool_services.sdk import ExecutorService, function_tool, text_result

log = logging.getLogger(__name__)

TOOL_NAME = "run_python"
PARAMETERS = {
    "type": "object",
    "properties": {
        "code": {
            "type": "string",
            "description": "A complete Python 3 program. Print what you want to see; write files to produce them.",
        }
    },
    "required": ["code"],
    "additionalProperties": False,
}
# Run at start: the service refuses to serve if the sandbox cannot run code or leaks the network.
# It also finds out whether the code can signal its own children (through the keeper): not on a
# kernel without seccomp user notification, where only its own process group can be signalled.
SELF_TEST = """
import os, socket
try:
    socket.socket(socket.AF_INET, socket.SOCK_STREAM)
except OSError:
    pass
else:
    raise SystemExit("socket creation is not denied")
if os.environ.keys() - {"LC_CTYPE"}:
    raise SystemExit("the environment is not empty")
r, w = os.pipe()
child = os.fork()
if child == 0:
    os.close(w)
    os.read(r, 1)
    os._exit(0)
try:
    os.kill(child, 0)
    print("signals:", "its own processes, by pid or group (the keeper checks each pid)")
except PermissionError:
    print("signals:", "its own process group only (no seccomp user notification or pidfd here)")
os.close(w)
os.waitpid(child, 0)
print("ok")
"""


# How one call's processes share one memory budget; said in the startup log line.
CGROUP_BUDGET = "cgroup v2 (memory.max and pids.max of a cgroup per call)"
WATCHER_BUDGET = (
    "watcher (resident and swapped-out memory of the call's processes, summed every 0.1 s; "
    "memfds, shared anonymous memory and splicing into pipes refused)"
)
# What the child (child.py) imports, asked of a candidate interpreter.
_NEEDS = "import ctypes, json, resource, signal, socket, struct, threading"
# Interpreters any uid can usually run, tried when the service's own one is out of the code's reach.
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")


class SandboxError(RuntimeError):
    """The sandbox cannot run code on this machine with the isolation it was asked for."""


class SandboxService(ExecutorService):
    kind = pb.ToolKind.TOOL_KIND_SANDBOX
    name = "sandbox"
    # The standard loop: a call's process is started with asyncio's subprocess options (umask),
    # which uvloop's lacks, and a process per call makes the loop's own cost immaterial.
    event_loop = "asyncio"

    def __init__(self, settings: SandboxSettings | None = None) -> None:
        self.settings = settings or SandboxSettings()
        self.limits = Limits.from_settings(self.settings)
        self._runner: Runner | None = None
        self._running = 0

    @property
    def isolation(self) -> Isolation:
        return self.runner.isolation

    @property
    def runner(self) -> Runner:
        if self._runner is None:
            raise RuntimeError("SandboxService.start() was not called")
        return self._runner

    async def start(self) -> None:
        make_undumpable()
        self._runner = await prepare_runner(self.settings, self.limits)

    async def list_tools(self) -> list[pb.ExecutorTool]:
        s = self.settings
        description = (
            "Run a Python 3 program in an isolated sandbox and get its stdout, stderr, exit code and the files "
            "it wrote. Each call starts fresh in an empty working directory (nothing persists between calls); "
            "files the program writes there (relative paths) are returned. There is no network access and no "
            f"package installation. Limits: {s.timeout_seconds:g} s wall-clock, {s.cpu_seconds} s CPU, "
            f"{s.memory_mb} MB memory, {s.max_output_bytes // 1024} KiB of output per stream. "
            "The result is JSON: exit_code, error, limit, stdout, stderr, files."
        )
        return [function_tool(TOOL_NAME, description, PARAMETERS)]

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: ProgressSink) -> pb.FunctionCallOutput:
        if call.name != TOOL_NAME:
            return text_result(f"unknown tool {call.name!r}: this sandbox offers {TOOL_NAME}", is_error=True)
        limit = self.settings.max_concurrency
        if self._running >= limit:
            raise RequestError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"sandbox busy: {self._running} calls running, the limit is {limit}; retry later",
                reason="sandbox_busy",
            )
        code = _code(call.arguments, self.settings.max_code_bytes)
        if isinstance(code, pb.FunctionCallOutput):
            log.info("%s call %s refused: %s", TOOL_NAME, call.call_id, code.output)
            return code
        self._running += 1
        try:
            outcome = await self.runner.run(code, progress)
        finally:
            self._running -= 1
        output = json.dumps(outcome.to_json(self.limits.timeout_seconds), ensure_ascii=False)
        return pb.FunctionCallOutput(output=output, is_error=outcome.is_error)


async def prepare_runner(s: SandboxSettings, limits: Limits) -> Runner:
    """The strongest isolation this machine allows that passes the self-test, or SandboxError."""
    run_as = s.user if os.geteuid() == 0 else None
    setpriv = shutil.which("setpriv") if run_as is not None else None
    if run_as is not None and setpriv is None:
        raise SandboxError(f"running as root, the sandbox needs setpriv (util-linux) to run code as uid {run_as}")
    python = s.python
    if run_as is not None and setpriv is not None:
        python = await _interpreter_for(run_as, setpriv, s.python, chosen="python" in s.model_fields_set)
    prefixes = await interpreter_prefixes(python)
    read_paths = tuple(dict.fromkeys([*SYSTEM_READ_PATHS, *prefixes, *s.read_paths]))
    for switch in test_only_switches():
        log.warning("test-only switch %s is set: the sandbox pretends to run on an older kernel", switch)
    fallback = Isolation(python, None, landlock_abi(), run_as, read_paths, setpriv, keeper_signals())
    if not fallback.landlock_abi:
        log.warning("no Landlock in this kernel: the code can read and write whatever its uid can")
    unshare = shutil.which("unshare") if s.namespaces != "off" else None
    if s.namespaces == "required" and not unshare:
        raise SandboxError("namespaces are required but unshare is not installed")
    candidates = [dataclasses.replace(fallback, unshare=unshare)] if unshare else []
    if s.namespaces != "required":
        candidates.append(fallback)
    delegated = await asyncio.to_thread(delegate)
    cgroups = delegated if isinstance(delegated, CallCgroups) else None
    failures: list[str] = []
    for isolation in candidates:
        files = FilePolicy(s.max_files, s.max_files_bytes)
        runner = Runner(isolation, limits, files, s.workdir_root, cgroups)
        problem, signals = await _self_test(runner)
        if problem is not None and cgroups is not None:
            log.warning("per-call cgroups failed the self-test (%s): the memory watcher holds the budget", problem)
            delegated, cgroups = f"per-call cgroups failed the self-test: {problem}", None
            runner = Runner(isolation, limits, files, s.workdir_root)
            problem, signals = await _self_test(runner)
        if problem is None:
            budget = CGROUP_BUDGET if cgroups is not None else f"{WATCHER_BUDGET} (no cgroup: {delegated})"
            described = f"{isolation.describe()}; signals: {signals}"
            log.info("sandbox isolation: %s; memory per call: %s", described, budget)
            if failures:
                log.warning("sandbox fell back to %s: %s", isolation.network, failures[0])
            return runner
        failures.append(f"{isolation.network}: {problem}")
    hint = ""
    if run_as is not None:
        hint = f" (the code runs as uid {run_as}: can it execute {s.python}? set ANTWORT_SANDBOX_PYTHON)"
    raise SandboxError("the sandbox cannot run code here: " + "; ".join(failures) + hint)


async def _interpreter_for(uid: int, setpriv: str, python: str, *, chosen: bool) -> str:
    """An interpreter that `uid` can run with what the sandbox needs: `python`, or, when that was
    not chosen explicitly (the service's own one, under /root say, which uid 65534 cannot enter),
    the system's. SandboxError with the one setting to change otherwise."""
    problem = await _runs_as(uid, setpriv, python)
    if problem is None:
        return python
    if not chosen:
        for candidate in SYSTEM_PYTHONS:
            if candidate != python and await _runs_as(uid, setpriv, candidate) is None:
                log.warning(
                    "uid %d cannot run the service's interpreter %s (%s): the code runs with %s; "
                    "set ANTWORT_SANDBOX_PYTHON to choose another",
                    uid,
                    python,
                    problem,
                    candidate,
                )
                return candidate
    raise SandboxError(
        f"uid {uid} (ANTWORT_SANDBOX_USER) cannot run {python} ({problem}): set ANTWORT_SANDBOX_PYTHON to an "
        "interpreter it can execute, e.g. /usr/bin/python3"
    )


async def _runs_as(uid: int, setpriv: str, python: str) -> str | None:
    """None when `uid` can start `python` and import what the sandbox's child needs, else why not."""
    # Through env: setpriv itself execs with the capabilities it had, so only a second exec, as the
    # sandbox's own chain does, shows what the uid alone can reach.
    env = shutil.which("env") or "/usr/bin/env"
    drop = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    argv = [*drop, env, python, "-I", "-S", "-c", _NEEDS]
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, env={}, cwd="/",
        )  # fmt: skip
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    except (OSError, TimeoutError) as error:
        return str(error)
    if proc.returncode == 0:
        return None
    lines = err.decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else f"exit status {proc.returncode}"


def _code(arguments: str, max_bytes: int) -> str | pb.FunctionCallOutput:
    """The `code` argument, or an is_error result that tells the model what was wrong."""
    try:
        args = json.loads(arguments or "{}")
    except ValueError as err:
        return text_result(f"arguments are not valid JSON: {err}", is_error=True)
    code = args.get("code") if isinstance(args, dict) else None
    if not isinstance(code, str) or not code.strip():
        return text_result('arguments must be a JSON object with a non-empty string "code"', is_error=True)
    try:
        size = len(code.encode())
    except UnicodeEncodeError as err:  # a lone UTF-16 surrogate ("\ud800" in the JSON): no UTF-8 for it
        where = f"\\u{ord(code[err.start]):04x} at character {err.start}"
        return text_result(f'"code" is not valid Unicode text: it holds a lone surrogate ({where})', is_error=True)
    if size > max_bytes:
        return text_result(f"the code is longer than {max_bytes} bytes", is_error=True)
    return code


async def _self_test(runner: Runner) -> tuple[str | None, str]:
    """(what is wrong, or None; what the code may signal)."""
    try:
        outcome = await runner.run(SELF_TEST, lambda _: None)
    except OSError as err:
        return str(err), ""
    lines = outcome.stdout.text().splitlines()
    if lines[-1:] == ["ok"] and lines[0].startswith("signals: ") and not outcome.is_error:
        return None, lines[0].removeprefix("signals: ")
    error = outcome.error(runner.limits.timeout_seconds) or "unexpected output"
    return f"{error}: {outcome.stderr.text().strip()[-300:] or outcome.stdout.text()[-300:] or 'no output'}", ""
