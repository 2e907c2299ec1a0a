"""One run of code: a fresh directory, the hardened child, its output read under caps, a wall-clock
timeout that kills the whole process group, the files it produced, and the directory removed.

All waiting is asyncio; file-system work that may take long (collecting files, removing a big
directory) runs in a worker thread, so the event loop that serves gRPC never blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from antwort_grpc.executors.base import ProgressSink
from antwort_grpc.tool_services.sandbox.budget import watch_memory
from antwort_grpc.tool_services.sandbox.cgroup import CallCgroups
from antwort_grpc.tool_services.sandbox.isolation import Isolation
from antwort_grpc.tool_services.sandbox.limits import Captured, Limits, read_capped
from antwort_grpc.tool_services.sandbox.output import Outcome, ProducedFile, collect_files, exit_status
from antwort_grpc.tool_services.sandbox.session import end_session

log = logging.getLogger(__name__)

# The child exits right after the code's processes are gone; these only bound the unexpected: how
# long it gets after it was asked to stop the code, and how long its pipes then get to close.
STOP_GRACE_SECONDS = 5.0
DRAIN_SECONDS = 5.0
# The keeper's report is one short JSON object.
MAX_REPORT_BYTES = 65536


@dataclass(frozen=True, slots=True)
class FilePolicy:
    max_files: int
    max_bytes: int


@dataclass(slots=True)
class _Workdir:
    root: str
    work: str
    main: str


@dataclass(slots=True, eq=False)
class Runner:
    isolation: Isolation
    limits: Limits
    files: FilePolicy
    workdir_root: str | None
    # Per-call cgroups where the service may make them; else the memory watcher.
    cgroups: CallCgroups | None = None

    async def run(self, code: str, progress: ProgressSink) -> Outcome:
        workdir = await asyncio.to_thread(self._make_workdir, code)
        try:
            outcome = await self._run_in(workdir, progress)
            if outcome.setup_error is None:
                outcome.files, outcome.files_not_listed = await asyncio.to_thread(
                    collect_files,
                    workdir.work,
                    owner=self.isolation.code_owner(),
                    max_files=self.files.max_files,
                    max_bytes=self.files.max_bytes,
                )
            return outcome
        finally:
            await _remove(workdir.root)

    def _end_code(self, pid: int) -> None:
        """Stop the code now: the keeper kills the code's group, reaps it and exits. SIGTERM to the
        child's group: unshare (namespaces) holds it back and waits for the keeper, pid 1 of the
        namespace, whose handler does the work. Killing unshare outright would hand the keeper to
        the service's pid 1 as an orphan instead."""
        _signal_group(pid, signal.SIGTERM)

    async def _ended(self, proc: asyncio.subprocess.Process, report: asyncio.Task[dict[str, Any]]) -> None:
        """Wait for the keeper's end (its report; or the end of its pipe, if it died), kill the child
        if it does not come; then kill whatever is left of the call's session (orphans of a keeper
        that died), so that nothing of the call outlives it, and reap the child."""
        try:
            await asyncio.wait_for(asyncio.shield(report), STOP_GRACE_SECONDS)
        except TimeoutError:
            log.warning("sandbox child %d did not end in %gs: killing its group", proc.pid, STOP_GRACE_SECONDS)
            _kill_group(proc.pid)
        killed = await asyncio.to_thread(end_session, proc.pid)
        if killed:
            log.warning("killed %d process(es) the sandbox child %d left behind", killed, proc.pid)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(report), DRAIN_SECONDS)
        try:
            await asyncio.wait_for(proc.wait(), DRAIN_SECONDS)
        except TimeoutError:
            log.warning("sandbox child %d: its output pipes stayed open", proc.pid)

    def _make_workdir(self, code: str) -> _Workdir:
        root = tempfile.mkdtemp(prefix="antwort-sandbox-", dir=self.workdir_root)
        work = os.path.join(root, "work")
        main = os.path.join(root, "main.py")
        os.mkdir(work, 0o700)
        with open(main, "w", encoding="utf-8") as f:
            f.write(code)
        if self.isolation.run_as is not None:
            for path in (root, work, main):
                os.chown(path, self.isolation.run_as, self.isolation.run_as)
        return _Workdir(root, work, main)

    async def _run_in(self, workdir: _Workdir, progress: ProgressSink) -> Outcome:
        cgroups = self.cgroups
        if cgroups is None:
            return await self._spawn_and_wait(workdir, progress, None)
        name = os.path.basename(workdir.root)
        cgroup = await asyncio.to_thread(cgroups.create, name, self.limits.memory_bytes, self.limits.processes)
        try:
            outcome = await self._spawn_and_wait(workdir, progress, (cgroups, cgroup))
            if outcome.limit is None and await asyncio.to_thread(cgroups.oom_killed, cgroup):
                outcome.limit = "memory"
            return outcome
        finally:
            try:
                await asyncio.to_thread(cgroups.remove, cgroup)
            except OSError as err:
                log.warning("could not remove the call's cgroup %s: %s", cgroup, err)

    async def _spawn_and_wait(
        self, workdir: _Workdir, progress: ProgressSink, cgroup: tuple[CallCgroups, Path] | None
    ) -> Outcome:
        status_r, status_w = os.pipe()
        argv = self.isolation.command(
            self.limits.rlimits(), workdir.root, workdir.work, workdir.main, status_w,
            count_all_memory=cgroup is not None,
        )  # fmt: skip
        gate_r, gate_w = os.pipe() if cgroup is not None else (-1, -1)
        if cgroup is not None:
            # The child waits at this gate (its stdin) until it is in the call's cgroup, so nothing
            # of the call ever runs outside it; a gate closed unopened (entering failed) ends it.
            script = 'read -r _ || exit 125; exec </dev/null; exec "$@"'
            argv = [shutil.which("sh") or "/bin/sh", "-c", script, "sh", *argv]
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=gate_r if cgroup is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={},
                cwd=workdir.work,
                start_new_session=True,
                pass_fds=(status_w,),
                umask=0o077,
            )
        except BaseException:
            os.close(status_r)
            if cgroup is not None:
                os.close(gate_w)
            raise
        finally:
            os.close(status_w)
            if cgroup is not None:
                os.close(gate_r)
        if cgroup is not None:
            try:
                await asyncio.to_thread(cgroup[0].enter, cgroup[1], proc.pid)
                os.write(gate_w, b"\n")
            except OSError as err:
                log.warning("could not put the call into its cgroup %s: %s", cgroup[1], err)
            finally:
                os.close(gate_w)
        progress("started")
        limit: str | None = None

        def stop(reason: str) -> None:
            nonlocal limit
            limit = limit or reason
            self._end_code(proc.pid)

        assert proc.stdout is not None and proc.stderr is not None
        watcher = asyncio.create_task(
            watch_memory(proc.pid, self.limits.memory_bytes, lambda _: stop("memory"))
            if cgroup is None
            else asyncio.sleep(0)  # the cgroup's memory.max holds the budget
        )
        readers = (
            asyncio.create_task(read_capped(proc.stdout, self.limits.output_bytes, lambda: stop("output"))),
            asyncio.create_task(read_capped(proc.stderr, self.limits.output_bytes, lambda: stop("output"))),
        )
        # The end of the call is the end of the status pipe, which only the keeper (and unshare)
        # hold: it comes with the keeper's report, or with its death. Not the child's exit as
        # proc.wait() sees it: that also waits for stdout and stderr, which orphans would hold.
        reporting = asyncio.create_task(_read_report(os.fdopen(status_r, "rb", 0)))
        ended = False
        try:
            try:
                await asyncio.wait_for(asyncio.shield(reporting), self.limits.timeout_seconds)
            except TimeoutError:
                stop("timeout")
            await self._ended(proc, reporting)
            ended = True
            done, _ = await asyncio.wait(readers, timeout=DRAIN_SECONDS)
            stdout, stderr = (r.result() if r in done else Captured(b"", True) for r in readers)
        finally:
            watcher.cancel()
            for reader in readers:
                reader.cancel()
            if not ended:  # cancelled: the caller went away
                self._end_code(proc.pid)
                await self._ended(proc, reporting)
            reporting.cancel()
        report = reporting.result() if reporting.done() and not reporting.cancelled() else {}
        outcome = Outcome(None, stdout, stderr, time.monotonic() - started, limit=limit)
        if "setup_error" in report:
            outcome.setup_error = str(report["setup_error"])
        elif "exit_code" in report:
            outcome.exit_code, outcome.signal, code_limit = exit_status(int(report["exit_code"]))
            outcome.limit = outcome.limit or code_limit
        elif limit is not None:
            outcome.signal = signal.SIGKILL.name
        else:
            outcome.setup_error = f"the sandbox process ended without a report (status {proc.returncode})"
            log.warning("sandbox child ended without a report: %s; stderr %r", proc.returncode, stderr.text()[-500:])
        progress(_summary(outcome))
        return outcome


def _kill_group(pgid: int) -> None:
    _signal_group(pgid, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def _read_report(pipe: BinaryIO) -> dict[str, Any]:
    """The keeper's one JSON report, read until every writer of the pipe is gone; {} if none."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    try:
        data = b""
        while chunk := await reader.read(MAX_REPORT_BYTES):
            data = (data + chunk)[:MAX_REPORT_BYTES]
    finally:
        transport.close()
    try:
        report = json.loads(data) if data else {}
    except ValueError:
        return {}
    return report if isinstance(report, dict) else {}


def _summary(outcome: Outcome) -> str:
    if outcome.limit:
        return f"stopped: {outcome.limit} limit"
    if outcome.setup_error:
        return "failed to start"
    if outcome.signal:
        return f"killed by {outcome.signal}"
    return f"exited {outcome.exit_code}"


async def _remove(root: str) -> None:
    try:
        await asyncio.to_thread(_remove_tree, root)
    except OSError as err:
        log.warning("could not remove sandbox directory %s: %s", root, err)


def _remove_tree(root: str) -> None:
    """`rm -rf`, not shutil.rmtree: the code decides how deep its directories nest, and rmtree
    recurses (RecursionError past ~1,000 levels, leaving the directory on disk); rm walks any depth
    and any path length. The code may have taken permissions away from its own directories: then
    give them back (`chmod -R` sets a directory's mode before it descends) and remove again."""
    rm = [shutil.which("rm") or "/bin/rm", "-rf", "--one-file-system", "--", root]
    if _quiet(rm) and not os.path.lexists(root):
        return
    _quiet([shutil.which("chmod") or "/bin/chmod", "-R", "u+rwx", "--", root])
    _quiet(rm)
    if os.path.lexists(root):
        raise OSError(f"{root} is still there after rm -rf")


def _quiet(argv: list[str]) -> bool:
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, check=False, env={}).returncode == 0


__all__ = ["FilePolicy", "ProducedFile", "Runner"]
