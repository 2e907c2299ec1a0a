"""The child side of one sandbox run: harden this process, then run the code in a fresh interpreter.

The service starts it as `python -I -S -c <this file's source> <config JSON>` (inside the
namespaces when they are on), so it uses the standard library only and imports nothing of the
package. It forks the code's process, which in order sets the resource limits, no_new_privs, drops
every capability, restricts the file system, TCP and signals with Landlock, installs a seccomp
filter and execs the interpreter. This process stays outside all that as the code's keeper: it
kills and reaps what the code leaves behind, and writes the code's exit status as JSON to the
status descriptor, which the code never sees. A hardening step that fails is reported there too,
and the code does not run.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import resource
import signal
import sys
from dataclasses import dataclass
from typing import Any

_libc = ctypes.CDLL(None, use_errno=True)

# prctl(2) options and securebits.
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECURE_ALL_BITS_LOCKED = 0xFF  # noroot, no_setuid_fixup, keep_caps off, no_cap_ambient_raise; all locked
SECCOMP_MODE_FILTER = 2
CAP_SETPCAP = 8

# Landlock (ABI versions add rights; the ruleset lists only those the kernel knows).
LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_RULE_PATH_BENEATH = 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_ABI1 = (1 << 13) - 1  # execute … make_sym
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
FS_FILE_ONLY = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

# seccomp BPF.
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_RET_K, BPF_AND_K = 0x20, 0x15, 0x35, 0x06, 0x54
RET_KILL_PROCESS, RET_ALLOW, RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
X32_SYSCALL_BIT = 0x40000000
SECCOMP_ARGS = 16  # offsetof(struct seccomp_data, args[0]); each argument is 8 bytes, low word first
SOCK_STREAM, SOCK_TYPE_MASK = 1, 0xF
PRIO_PROCESS, IOPRIO_WHO_PROCESS = 0, 1

EPERM, EACCES = errno.EPERM, errno.EACCES

# The syscalls the filter names, per architecture.
SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {
        "socket": 41, "connect": 42, "bind": 49, "sendto": 44, "socketpair": 53,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "setsid": 112, "setpgid": 109, "tkill": 200, "pidfd_send_signal": 424,
        "kill": 62, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297, "pidfd_open": 434,
        "prlimit64": 302, "setpriority": 141, "ioprio_set": 251, "sched_setaffinity": 203,
        "sched_setscheduler": 144, "sched_setparam": 142, "sched_setattr": 314,
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_getfd": 438, "kcmp": 312,
        "perf_event_open": 298, "migrate_pages": 256, "move_pages": 279, "process_madvise": 440,
        "process_mrelease": 448,
    },
    "aarch64": {
        "socket": 198, "connect": 203, "bind": 200, "sendto": 206, "socketpair": 199,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "setsid": 157, "setpgid": 154, "tkill": 130, "pidfd_send_signal": 424,
        "kill": 129, "tgkill": 131, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240, "pidfd_open": 434,
        "prlimit64": 261, "setpriority": 140, "ioprio_set": 30, "sched_setaffinity": 122,
        "sched_setscheduler": 119, "sched_setparam": 118, "sched_setattr": 274,
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_getfd": 438, "kcmp": 272,
        "perf_event_open": 241, "migrate_pages": 238, "move_pages": 239, "process_madvise": 440,
        "process_mrelease": 448,
    },
}  # fmt: skip

# Denied outright -> errno. socket(2) is the network (every family: a Unix socket path can reach a
# host daemon), and connect/bind have nothing legitimate to work on without it; io_uring can open
# sockets without socket(2); setsid/setpgid would let a process leave the group that is killed;
# tkill and pidfd_send_signal reach processes by a number this filter cannot check. The rest read,
# write or steer another process's memory (in the fallback the code has the service's uid, and
# every call's code shares one uid).
DENIED: dict[str, int] = {
    "socket": EACCES, "connect": EACCES, "bind": EACCES,
    "io_uring_setup": EPERM, "io_uring_enter": EPERM, "io_uring_register": EPERM,
    "setsid": EPERM, "setpgid": EPERM, "tkill": EPERM, "pidfd_send_signal": EPERM,
    "ptrace": EPERM, "process_vm_readv": EPERM, "process_vm_writev": EPERM, "pidfd_getfd": EPERM,
    "kcmp": EPERM, "perf_event_open": EPERM, "migrate_pages": EPERM, "move_pages": EPERM,
    "process_madvise": EPERM, "process_mrelease": EPERM,
}  # fmt: skip

# Syscalls whose first argument is a pid (or -pgid, or -1 for all): denied for protected ones.
SIGNALLING = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_open")


@dataclass(frozen=True)
class Arg:
    """One argument word that must equal `value` (after `mask`) for the call to be allowed."""

    index: int
    value: int
    mask: int = 0xFFFFFFFF
    high: bool = False  # the upper 32 bits of a 64-bit argument (a pointer)


SELF = (Arg(0, 0),)
# Allowed only in the form named, else errno: limits, priority, CPU affinity, scheduling and I/O
# priority of the calling thread itself (pid/who 0), never of another process of the same uid (the
# service, or another call's code); socketpair only of connected stream sockets (a datagram one can
# be re-addressed with sendto or connect to any socket path on the host, /dev/log say); sendto
# without a destination.
CONDITIONAL: dict[str, tuple[int, tuple[Arg, ...]]] = {
    "prlimit64": (EPERM, SELF),
    "sched_setaffinity": (EPERM, SELF),
    "sched_setscheduler": (EPERM, SELF),
    "sched_setparam": (EPERM, SELF),
    "sched_setattr": (EPERM, SELF),
    "setpriority": (EPERM, (Arg(0, PRIO_PROCESS), Arg(1, 0))),
    "ioprio_set": (EPERM, (Arg(0, IOPRIO_WHO_PROCESS), Arg(1, 0))),
    "socketpair": (EACCES, (Arg(1, SOCK_STREAM, SOCK_TYPE_MASK),)),
    "sendto": (EACCES, (Arg(4, 0), Arg(4, 0, high=True))),
}


@dataclass(frozen=True)
class Arch:
    audit: int
    numbers: dict[str, int]


ARCHES: dict[str, Arch] = {
    "x86_64": Arch(0xC000003E, SYSCALLS["x86_64"]),
    "aarch64": Arch(0xC00000B7, SYSCALLS["aarch64"]),
}


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


class RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _prctl(option: int, arg: int = 0) -> int:
    return int(_libc.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)))


def set_limits(limits: list[list[Any]]) -> None:
    for name, soft, hard in limits:
        resource.setrlimit(getattr(resource, name), (soft, hard))


def drop_capabilities() -> None:
    """Leave no capability behind, and make exec not grant them again to uid 0 (the namespace's
    root): securebits first, while CAP_SETPCAP is still there."""
    header, data = CapHeader(0x20080522, 0), (CapData * 2)()
    _check(_libc.capget(ctypes.byref(header), data), "capget")
    if not any(d.permitted or d.effective or d.inheritable for d in data):
        return
    if data[0].effective & (1 << CAP_SETPCAP):
        # Without CAP_SETPCAP (a non-root service that kept a capability or two) neither is
        # possible nor needed: with no capability left and no_new_privs, exec grants none.
        _check(_prctl(PR_SET_SECUREBITS, SECURE_ALL_BITS_LOCKED), "securebits")
        cap = 0
        while _prctl(PR_CAPBSET_DROP, cap) == 0:
            cap += 1
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    _check(_libc.capset(ctypes.byref(header), (CapData * 2)()), "capset")


def landlock(abi: int, read: list[str], write: list[str], devices: list[str]) -> None:
    """Reads only beneath `read`, writes only beneath `write`; with ABI 4 no TCP bind/connect, with
    ABI 6 no signals to processes outside the sandbox and no abstract Unix sockets out of it."""
    fs = FS_ABI1 | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0) | (FS_IOCTL_DEV if abi >= 5 else 0)
    attr = RulesetAttr(fs, NET_BIND_TCP | NET_CONNECT_TCP, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = _check(_libc.syscall(LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0), "landlock")
    reading = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
    device = FS_READ_FILE | FS_WRITE_FILE | (FS_TRUNCATE if abi >= 3 else 0)
    for paths, access in ((read, reading), (write, fs), (devices, device)):
        for path in paths:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # not on this system
            try:
                allowed = access if os.path.isdir(path) else access & FS_FILE_ONLY
                rule = ctypes.byref(PathBeneath(allowed, fd))
                _check(_libc.syscall(LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, rule, 0), path)
            finally:
                os.close(fd)
    _check(_libc.syscall(LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    os.close(ruleset)


def seccomp_program(machine: str, protected: tuple[int, ...] = ()) -> list[tuple[int, int, int, int]]:
    """A classic BPF program: another architecture's syscalls kill, denied ones return an errno,
    conditional ones return theirs unless their arguments have the allowed form, and signals (or
    pidfds) aimed at a `protected` pid or process group (the service, the keeper, -1 for every
    process) fail with EPERM. Without Landlock's signal scoping the code runs as the service's uid
    in the fallback mode and could otherwise kill it."""
    if machine not in ARCHES:
        raise OSError(errno.ENOSYS, f"no seccomp filter for {machine}")
    arch = ARCHES[machine]
    prog = [(BPF_LD_W_ABS, 0, 0, 4), (BPF_JEQ_K, 1, 0, arch.audit), (BPF_RET_K, 0, 0, RET_KILL_PROCESS)]
    prog.append((BPF_LD_W_ABS, 0, 0, 0))
    if machine == "x86_64":  # the x32 ABI reaches the same syscalls under other numbers
        prog += [(BPF_JGE_K, 0, 1, X32_SYSCALL_BIT), (BPF_RET_K, 0, 0, RET_ERRNO | errno.ENOSYS)]
    for name, err in DENIED.items():
        prog += [(BPF_JEQ_K, 0, 1, arch.numbers[name]), (BPF_RET_K, 0, 0, RET_ERRNO | err)]
    # Each block below loads an argument over the syscall number, so it ends in a return; a
    # syscall that differs jumps past the block.
    for name, (err, args) in CONDITIONAL.items():
        checks: list[list[tuple[int, int, int, int]]] = []
        for arg in args:
            offset = SECCOMP_ARGS + 8 * arg.index + (4 if arg.high else 0)
            check = [(BPF_LD_W_ABS, 0, 0, offset)]
            if arg.mask != 0xFFFFFFFF:
                check.append((BPF_AND_K, 0, 0, arg.mask))
            checks.append(check)
        body: list[tuple[int, int, int, int]] = []
        for i, check in enumerate(checks):
            # A mismatch jumps to the denial: past the later checks (each ends in a JEQ) and the allow.
            later = sum(len(c) + 1 for c in checks[i + 1 :])
            body += [*check, (BPF_JEQ_K, 0, later + 1, args[i].value)]
        body += [(BPF_RET_K, 0, 0, RET_ALLOW), (BPF_RET_K, 0, 0, RET_ERRNO | err)]
        prog += [(BPF_JEQ_K, 0, len(body), arch.numbers[name]), *body]
    targets = sorted({pid & 0xFFFFFFFF for pid in protected})
    for name in SIGNALLING:
        prog.append((BPF_JEQ_K, 0, 2 + 2 * len(targets), arch.numbers[name]))
        prog.append((BPF_LD_W_ABS, 0, 0, SECCOMP_ARGS))
        for target in targets:
            prog += [(BPF_JEQ_K, 0, 1, target), (BPF_RET_K, 0, 0, RET_ERRNO | errno.EPERM)]
        prog.append((BPF_RET_K, 0, 0, RET_ALLOW))
    prog.append((BPF_RET_K, 0, 0, RET_ALLOW))
    return prog


def protected_pids() -> tuple[int, ...]:
    """What the code must not signal: this keeper and its group, the process that started it (the
    service, in the fallback mode) and its group, and every process at once (-1)."""
    pids = {os.getpid(), -os.getpid(), -1}
    parent = os.getppid()
    if parent > 1:
        pids.add(parent)
        with contextlib.suppress(OSError):
            pids.add(-os.getpgid(parent))
    return tuple(sorted(pids))


def install_seccomp(protected: tuple[int, ...]) -> None:
    prog = seccomp_program(os.uname().machine, protected)
    filters = (SockFilter * len(prog))(*[SockFilter(*ins) for ins in prog])
    fprog = SockFprog(len(prog), filters)
    mode = ctypes.c_ulong(SECCOMP_MODE_FILTER)
    _check(_libc.prctl(PR_SET_SECCOMP, mode, ctypes.byref(fprog), ctypes.c_ulong(0), ctypes.c_ulong(0)), "seccomp")


def harden(config: dict[str, Any], protected: tuple[int, ...]) -> None:
    set_limits(config["rlimits"])
    _check(_prctl(PR_SET_NO_NEW_PRIVS, 1), "no_new_privs")
    drop_capabilities()
    if config["landlock"]:
        ll = config["landlock"]
        landlock(ll["abi"], ll["read"], ll["write"], ll["devices"])
    install_seccomp(protected)


def run(config: dict[str, Any]) -> dict[str, Any]:
    """Fork the code into a process group of its own, harden it there and exec its interpreter
    with an empty environment. Kill that whole group when the code's main process ends or on
    SIGTERM (the service's timeout), and reap every process before reporting: as a subreaper (or
    pid 1 of a pid namespace) this process inherits the orphans, so nothing outlives the call."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_DUMPABLE, 0)
    setup_r, setup_w = os.pipe()  # close-on-exec: end-of-file once the code's interpreter runs
    protected = protected_pids()
    # The stop request (SIGTERM) is handled from before the fork on: as pid 1 of a pid namespace
    # this process would otherwise ignore it, and outside one die of it and orphan the code.
    code = {"pid": 0, "stop": False}

    def on_stop(*_: object) -> None:
        code["stop"] = True
        if code["pid"]:
            _kill_group(code["pid"])

    signal.signal(signal.SIGTERM, on_stop)
    pid = os.fork()
    if pid == 0:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.close(setup_r)
            os.setpgid(0, 0)
            harden(config, protected)
            os.execve(config["python"], [config["python"], "-I", config["main"]], {})
        except OSError as err:
            os.write(setup_w, str(err).encode())
        finally:
            os._exit(127)
    os.close(setup_w)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # also here, so that the group exists before a SIGTERM can ask for its end
    code["pid"] = pid
    if code["stop"]:
        _kill_group(pid)
    setup_error = os.read(setup_r, 4096).decode(errors="replace")
    status = None
    while True:
        try:
            done, wait_status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if done == pid:
            status = wait_status
            _kill_group(pid)
    if setup_error or status is None:
        return {"setup_error": setup_error or "the code's process vanished"}
    return {"exit_code": os.waitstatus_to_exitcode(status)}


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)


def main(raw: str) -> None:
    config = json.loads(raw)
    status_fd = int(config["status_fd"])
    os.set_inheritable(status_fd, False)
    os.write(status_fd, json.dumps(run(config)).encode())


if __name__ == "__main__":
    main(sys.argv[1])
