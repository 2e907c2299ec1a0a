"""What isolation this machine allows, and the command line of one run.

Always, in the child (child.py): resource limits, no capabilities, a seccomp filter that denies
sockets (and Unix sockets addressed by path), io_uring, setsid and setpgid, and acting on any
process but the code's own, and an empty environment. Where the kernel has it,
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
)
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")

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
        self, rlimits: list[tuple[str, int, int]], root: str, work: str, main: str, status_fd: int
    ) -> list[str]:
        """The child's argv; `status_fd` is the inherited pipe it reports the exit status on."""
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


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 without Landlock."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        version = int(libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))
    except (OSError, AttributeError):
        return 0
    return max(version, 0)


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
