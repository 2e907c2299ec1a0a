"""One memory and process budget per call from cgroup v2, where the service may make cgroups.

At startup the service looks for a cgroup v2 hierarchy whose memory and pids controllers it may
use beneath its own cgroup: it moves itself into a leaf (`service`; a cgroup with processes cannot
hand controllers down) and makes `calls`, under which each call gets a cgroup of its own with
`memory.max`, `memory.swap.max` 0 and `pids.max`. The kernel then holds every process of the call
to one budget, and an allocation past it ends in the cgroup's OOM killer, never the service's.

Where that is not possible (cgroup v1 or a hybrid hierarchy, a read-only /sys/fs/cgroup as in most
containers, other processes sharing the service's cgroup), `delegate` says why and the runner
falls back to the watcher in budget.py.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids")
# The call's cgroup also holds the sandbox's helpers (setpriv, unshare, the keeper interpreter).
HELPER_BYTES = 32 * 1024 * 1024
HELPER_PROCESSES = 4


@dataclass(frozen=True, slots=True)
class CallCgroups:
    """Where per-call cgroups are made."""

    parent: Path

    def create(self, name: str, memory_bytes: int, processes: int) -> Path:
        path = self.parent / name
        path.mkdir()
        (path / "memory.max").write_text(str(memory_bytes + HELPER_BYTES))
        with contextlib.suppress(FileNotFoundError):  # a kernel without swap accounting
            (path / "memory.swap.max").write_text("0")
        (path / "pids.max").write_text(str(processes + HELPER_PROCESSES))
        return path

    @staticmethod
    def enter(path: Path, pid: int) -> None:
        (path / "cgroup.procs").write_text(str(pid))

    @staticmethod
    def oom_killed(path: Path) -> bool:
        """Whether the kernel killed a process of the call for passing memory.max."""
        try:
            events = dict(line.split() for line in (path / "memory.events").read_text().splitlines() if line)
        except (OSError, ValueError):
            return False
        return int(events.get("oom_kill", "0")) > 0

    @staticmethod
    def remove(path: Path) -> None:
        """Remove the call's cgroup; whatever still runs in it is killed first (cgroup.kill)."""
        try:
            path.rmdir()
        except FileNotFoundError:
            return
        except OSError:
            with contextlib.suppress(OSError):
                (path / "cgroup.kill").write_text("1")
            path.rmdir()


def own_cgroup(proc_self_cgroup: str) -> str | None:
    """This process's cgroup v2 path ("0::/path" in /proc/self/cgroup), None without one."""
    for line in proc_self_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def delegate(root: Path = ROOT, self_cgroup: str | None = None, pid: int | None = None) -> CallCgroups | str:
    """A place for per-call cgroups beneath this process's cgroup, or why there is none."""
    pid = os.getpid() if pid is None else pid
    if not (root / "cgroup.controllers").exists():
        return f"no cgroup v2 hierarchy at {root}"
    if self_cgroup is None:
        try:
            self_cgroup = own_cgroup(Path("/proc/self/cgroup").read_text())
        except OSError as err:
            return f"cannot read /proc/self/cgroup: {err}"
    if self_cgroup is None:
        return "this process is in no cgroup v2"
    own = root / self_cgroup.lstrip("/")
    try:
        available = (own / "cgroup.controllers").read_text().split()
        members = {int(p) for p in (own / "cgroup.procs").read_text().split()}
    except (OSError, ValueError) as err:
        return f"cannot read the service's cgroup {own}: {err}"
    missing = [c for c in CONTROLLERS if c not in available]
    if missing:
        return f"the cgroup controllers {', '.join(missing)} are not delegated to {own}"
    if members - {pid}:
        return f"other processes share the service's cgroup {own}"
    enable = " ".join(f"+{c}" for c in CONTROLLERS)
    try:
        service, calls = own / "service", own / "calls"
        service.mkdir(exist_ok=True)
        (service / "cgroup.procs").write_text(str(pid))
        (own / "cgroup.subtree_control").write_text(enable)
        calls.mkdir(exist_ok=True)
        (calls / "cgroup.subtree_control").write_text(enable)
    except OSError as err:
        return f"cannot make cgroups beneath {own}: {err}"
    return CallCgroups(calls)
