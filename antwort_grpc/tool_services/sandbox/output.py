"""What one run returns: the JSON in FunctionCallOutput.output (docs/sandbox.md describes it).

{"exit_code": 0, "signal": null, "limit": null, "error": null,
 "stdout": "...", "stderr": "", "stdout_truncated": false, "stderr_truncated": false,
 "files": [{"path": "out/result.csv", "size": 12, "encoding": "utf-8", "content": "a,b\\n1,2\\n"}],
 "files_not_listed": 0, "duration_ms": 42}
"""

from __future__ import annotations

import base64
import os
import signal
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from antwort_grpc.tool_services.sandbox.limits import Captured

# Signals that mean a resource limit stopped the code (the kernel sends them).
LIMIT_SIGNALS = {signal.SIGXCPU: "cpu", signal.SIGXFSZ: "file_size"}
MAX_LISTED = 100


@dataclass(slots=True)
class ProducedFile:
    path: str
    size: int
    content: bytes | None = None
    # Why the content is left out, when it is.
    omitted: str | None = None

    def to_json(self) -> dict[str, Any]:
        # A name that is not UTF-8 comes from os.scandir with its bytes as lone surrogates, which
        # the result (a protobuf string) cannot carry: they become U+FFFD.
        path = self.path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        entry: dict[str, Any] = {"path": path, "size": self.size}
        if self.content is None:
            entry["omitted"] = self.omitted
            return entry
        try:
            entry.update(encoding="utf-8", content=self.content.decode("utf-8"))
        except UnicodeDecodeError:
            entry.update(encoding="base64", content=base64.b64encode(self.content).decode("ascii"))
        return entry


@dataclass(slots=True)
class Outcome:
    # The code's exit status; None when it did not exit by itself (killed, or never started).
    exit_code: int | None
    stdout: Captured
    stderr: Captured
    duration: float
    signal: str | None = None
    # Which limit stopped the code: timeout, output, cpu, file_size, memory.
    limit: str | None = None
    # The sandbox could not run the code at all (a setup failure, not the code's fault).
    setup_error: str | None = None
    files: list[ProducedFile] = field(default_factory=list)
    files_not_listed: int = 0

    @property
    def is_error(self) -> bool:
        return self.exit_code != 0 or self.limit is not None or self.setup_error is not None

    def error(self, timeout: float) -> str | None:
        """One sentence for the model, when is_error."""
        match self.limit:
            case "timeout":
                return f"stopped: the code ran longer than {timeout:g} seconds"
            case "output":
                return "stopped: the code printed more output than the sandbox keeps"
            case "cpu":
                return "stopped: the code used up its CPU time"
            case "memory":
                return "stopped: the code's processes together used more memory than allowed"
            case "file_size":
                return "stopped: the code wrote a file larger than allowed"
        if self.setup_error:
            return f"the sandbox could not run the code: {self.setup_error}"
        if self.signal:
            return f"the code was killed by {self.signal}"
        if self.exit_code:
            return f"the code exited with status {self.exit_code}"
        return None

    def to_json(self, timeout: float) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "signal": self.signal,
            "limit": self.limit,
            "error": self.error(timeout),
            "stdout": self.stdout.text(),
            "stderr": self.stderr.text(),
            "stdout_truncated": self.stdout.truncated,
            "stderr_truncated": self.stderr.truncated,
            "files": [f.to_json() for f in self.files],
            "files_not_listed": self.files_not_listed,
            "duration_ms": round(self.duration * 1000),
        }


def exit_status(code: int) -> tuple[int | None, str | None, str | None]:
    """A wait status as os.waitstatus_to_exitcode gives it -> (exit code, signal name, limit)."""
    if code >= 0:
        return code, None, None
    sig = signal.Signals(-code)
    return None, sig.name, LIMIT_SIGNALS.get(sig)


def collect_files(work: str, *, owner: int, max_files: int, max_bytes: int) -> tuple[list[ProducedFile], int]:
    """Regular files the code left in its directory, in path order: the first `max_files` listed,
    with their content while the `max_bytes` budget lasts. Never follows a symlink, and skips files
    of another owner (a hard link to something the code did not write). Runs after every process of
    the code is gone, so nothing changes under it."""
    listed: list[ProducedFile] = []
    not_listed = 0
    budget = max_bytes
    for full in _walk_files(work):
        try:
            st = os.lstat(full)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_uid != owner:
            continue
        if len(listed) >= min(max_files, MAX_LISTED):
            not_listed += 1
            continue
        entry = ProducedFile(os.path.relpath(full, work), st.st_size)
        if st.st_size > budget:
            entry.omitted = "larger than what is left of the size budget for returned files"
        else:
            entry.content = _read(full, st.st_size)
            budget -= len(entry.content)
        listed.append(entry)
    return listed, not_listed


def _walk_files(top: str) -> Iterator[str]:
    """Every non-directory entry beneath `top`, depth first in name order (a directory's own
    entries before its subdirectories'). A loop over an explicit stack: the code decides how deep
    its directories nest, and a recursive walk fails past Python's recursion limit. Directories
    that cannot be read (a path past PATH_MAX, permissions the code took away) are skipped."""
    stack = [top]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if is_dir:
                subdirs.append(entry.path)
            else:
                yield entry.path
        stack.extend(reversed(subdirs))


def _read(path: str, size: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        chunks = []
        while size > 0 and (chunk := os.read(fd, min(size, 1 << 20))):
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
