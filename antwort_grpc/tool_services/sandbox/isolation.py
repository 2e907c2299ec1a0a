"""What isolation this machine allows, and the command line of one run.

Always, in the child (child.py): resource limits, no capabilities, the seccomp filter of
seccomp.py (no sockets, no Unix sockets addressed by path, no io_uring, no leaving the process
group, no acting on or signalling any process outside the code's own group), and an empty
environment. Where the kernel has it,
Landlock confines reads to the interpreter, system libraries and the call's directory, and writes
to that directory. Where `unshare` works (unprivileged user namespaces), the child also gets its
own user, network, pid, mount, IPC and UTS namespaces: no network interface at all, no view of the
service's processes, and one kill that takes every process with it.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from antwort_grpc.tool_services.sandbox import seccomp

CHILD_SOURCE = Path(__file__).with_name("child.py").read_text()

NAMESPACE_FLAGS = (
    "--user",
    "--map-root-user",
    "--net",
    "--pid",
    "--fork",
    "--kill-child",
    "--mount",
    "--mount-proc",
    "--ipc",
    "--uts",
)
# What an interpreter needs beyond its own prefix: shared libraries, the loader's cache, user and
# time-zone lookups, the CPU count. Nothing else of /etc, no home directories, no other /proc.
SYSTEM_READ_PATHS = (
    "/usr",
    "/lib",
    "/lib32",
    "/lib64",
    "/bin",
    "/sbin",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/mime.types",
    "/sys/devices/system/cpu",
    # Readable only: a writable shared mapping of it is shared memory the memory watcher cannot see.
    "/dev/zero",
)
DEVICES = ("/dev/null", "/dev/full", "/dev/random", "/dev/urandom")

PR_SET_DUMPABLE = 4
# Asked of the interpreter: where its standard library and packages live (symlinks resolved too).
_PREFIXES = """
import json, os, sys
dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
dirs |= {os.path.realpath(d) for d in dirs} | {os.path.dirname(os.path.realpath(sys.executable))}
print(json.dumps(sorted(dirs)))
"""


@dataclass(frozen=True, slots=True)
class Isolation:
    python: str
    # unshare's path when the namespaces are on.
    unshare: str | None
    # Landlock ABI version, 0 where the kernel has none.
    landlock_abi: int
    # The uid (and gid) the code runs as, when the service runs as root, and setpriv's path.
    run_as: int | None
    read_paths: tuple[str, ...]
    setpriv: str | None = None
    # Signals beyond the code's group judged by its keeper (seccomp user notification); off only
    # to test what a kernel without it gets.
    keeper_signals: bool = True

    @property
    def network(self) -> str:
        """How the network is denied: the name this mode goes by in logs and docs."""
        return "namespace+seccomp" if self.unshare else "seccomp"

    def describe(self) -> str:
        parts = [f"network: {self.network}"]
        parts.append("namespaces: user,net,pid,mount,ipc,uts" if self.unshare else "namespaces: off (fallback)")
        parts.append(f"filesystem: landlock v{self.landlock_abi}" if self.landlock_abi else "filesystem: no landlock")
        parts.append(f"uid: {self.run_as}" if self.run_as is not None else f"uid: {os.geteuid()} (the service's)")
        return "; ".join(parts)

    def code_owner(self) -> int:
        """The uid that files the code writes belong to, seen from the service."""
        return self.run_as if self.run_as is not None else os.geteuid()

    def command(
        self,
        rlimits: list[tuple[str, int, int]],
        root: str,
        work: str,
        main: str,
        status_fd: int,
        *,
        count_all_memory: bool = False,
    ) -> list[str]:
        """The child's argv; `status_fd` is the inherited pipe it reports the exit status on.
        `count_all_memory`: the call's budget (a cgroup) also sees memory held by descriptors."""
        landlock: dict[str, Any] | None = None
        if self.landlock_abi:
            read = [*self.read_paths, root, *(["/proc"] if self.unshare else [])]
            landlock = {"abi": self.landlock_abi, "read": read, "write": [work], "devices": list(DEVICES)}
        config = {
            "python": self.python,
            "main": main,
            "status_fd": status_fd,
            "rlimits": [list(r) for r in rlimits],
            "landlock": landlock,
            "seccomp": seccomp.child_config(
                os.uname().machine, count_all_memory=count_all_memory, notify=self.keeper_signals
            ),
        }
        argv = [self.python, "-I", "-S", "-c", CHILD_SOURCE, json.dumps(config)]
        if self.unshare:
            argv = [self.unshare, *NAMESPACE_FLAGS, "--", *argv]
        if self.run_as is not None:
            # Dropped by a program, not by the spawn: asking subprocess for another uid makes it
            # fork() instead of vfork(), and gRPC's fork handlers crash such a child before exec.
            # Dropped before unshare, so the namespace's root is this uid outside, not root.
            uid = str(self.run_as)
            argv = [self.setpriv or "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *argv]
        return argv


# Tests only: pretend the kernel's Landlock is no newer than this ABI, and that it has no seccomp
# user notification, to run on this machine what an older kernel gives.
TEST_ONLY_LANDLOCK_ABI_CAP = "ANTWORT_TEST_ONLY_LANDLOCK_ABI_CAP"
TEST_ONLY_NO_SECCOMP_NOTIFY = "ANTWORT_TEST_ONLY_NO_SECCOMP_NOTIFY"


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 without Landlock."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        version = max(int(libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))), 0)
    except (OSError, AttributeError):
        return 0
    cap = os.environ.get(TEST_ONLY_LANDLOCK_ABI_CAP)
    return min(version, int(cap)) if cap else version


def keeper_signals() -> bool:
    """Whether the filter hands signals to other pids to the keeper (where the kernel can)."""
    return not os.environ.get(TEST_ONLY_NO_SECCOMP_NOTIFY)


def test_only_switches() -> list[str]:
    return [name for name in (TEST_ONLY_LANDLOCK_ABI_CAP, TEST_ONLY_NO_SECCOMP_NOTIFY) if os.environ.get(name)]


def make_undumpable() -> None:
    """Nobody of the same uid may read this process's /proc files (environ, mem) or ptrace it:
    the code runs as that uid in the fallback mode."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_DUMPABLE, ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))


async def interpreter_prefixes(python: str) -> list[str]:
    """The directories the interpreter loads its standard library and packages from."""
    proc = await asyncio.create_subprocess_exec(
        python, "-I", "-c", _PREFIXES, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={}
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    if proc.returncode != 0:
        raise RuntimeError(f"interpreter {python!r} does not run: {err.decode(errors='replace').strip()}")
    prefixes: list[str] = json.loads(out)
    return prefixes
