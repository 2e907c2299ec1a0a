"""The child side of one sandbox run: harden this process, then run the code in a fresh interpreter.

The service starts it as `python -I -S -c <this file's source> <config JSON>` (inside the
namespaces when they are on), so it uses the standard library only and imports nothing of the
package. It forks the code's process into a process group of its own, which in order sets the
resource limits, no_new_privs, drops every capability, restricts the file system, TCP and signals
with Landlock, installs the seccomp filter the service built (seccomp.py) and execs the
interpreter. This process stays outside all that as the code's keeper: it kills and reaps what the
code leaves behind, writes the code's exit status as JSON to the status descriptor, which the code
never sees, and answers the filter's user notifications: a signal the code sends to a pid the
filter cannot judge is delivered only to a member of the code's own group. A hardening step that
fails is reported on the status descriptor too, and the code does not run.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import resource
import signal
import socket
import struct
import sys
import threading
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

# seccomp(2) with a listener for user notifications (kernel 5.0), and its ioctls: receive one
# (struct seccomp_notif, 80 bytes), answer it (struct seccomp_notif_resp, 24 bytes), check that its
# caller is still waiting. FLAG_CONTINUE (kernel 5.5) lets the kernel run the syscall as asked.
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
NOTIF_RECV, NOTIF_SEND, NOTIF_ID_VALID = 0xC0502100, 0xC0182101, 0x40082102
FLAG_CONTINUE = 1

# Landlock (ABI versions add rights; the ruleset lists only those the kernel knows).
LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_RULE_PATH_BENEATH = 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_ABI1 = (1 << 13) - 1  # execute … make_sym
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
FS_FILE_ONLY = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


class Notification(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_uint64), ("pid", ctypes.c_uint32), ("flags", ctypes.c_uint32),
        ("nr", ctypes.c_int32), ("arch", ctypes.c_uint32), ("ip", ctypes.c_uint64), ("args", ctypes.c_uint64 * 6),
    ]  # fmt: skip


class Answer(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("val", ctypes.c_int64), ("error", ctypes.c_int32), ("flags", ctypes.c_uint32)]


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


def install_seccomp(seccomp: dict[str, Any], group: int) -> int:
    """Install the filter, with the code's process group filled in. Returns the listener of its
    user notifications, for the keeper; -1 where there are none (a kernel before 5.0, or a seccomp
    profile that refuses them), and then the filter installed refuses what the keeper would judge."""
    if seccomp["program"] is not None:
        fprog = _fprog(seccomp["program"], group)
        flags = ctypes.c_ulong(SECCOMP_FILTER_FLAG_NEW_LISTENER)
        nr, mode = seccomp["syscalls"]["seccomp"], ctypes.c_ulong(SECCOMP_SET_MODE_FILTER)
        listener = int(_libc.syscall(nr, mode, flags, ctypes.byref(fprog)))
        if listener >= 0:
            return listener
    fprog = _fprog(seccomp["without_keeper"], group)
    mode = ctypes.c_ulong(SECCOMP_MODE_FILTER)
    _check(_libc.prctl(PR_SET_SECCOMP, mode, ctypes.byref(fprog), ctypes.c_ulong(0), ctypes.c_ulong(0)), "seccomp")
    return -1


def _fprog(program: list[list[Any]], group: int) -> SockFprog:
    values = {"group": group & 0xFFFFFFFF, "-group": -group & 0xFFFFFFFF}
    ins = [SockFilter(code, jt, jf, values[k] if isinstance(k, str) else k) for code, jt, jf, k in program]
    return SockFprog(len(ins), (SockFilter * len(ins))(*ins))


def harden(config: dict[str, Any], group: int) -> int:
    """Everything but the exec, in order; the listener of the filter's notifications (or -1)."""
    set_limits(config["rlimits"])
    _check(_prctl(PR_SET_NO_NEW_PRIVS, 1), "no_new_privs")
    drop_capabilities()
    if config["landlock"]:
        ll = config["landlock"]
        landlock(ll["abi"], ll["read"], ll["write"], ll["devices"])
    return install_seccomp(config["seccomp"], group)


class Signals:
    """The keeper's side of the filter: the signals the code sends to a pid the filter could not
    judge (seccomp.py). `kill` reaches a process only if it is in the code's group: the keeper
    opens a pidfd for it, then checks its group, then signals through that pidfd, so a pid
    reused meanwhile is never reached (the pidfd's process is gone: ESRCH). `tgkill` and the
    sigqueues only to the caller's own process, which cannot end while it waits for the answer."""

    def __init__(self, listener: int, group: int, syscalls: dict[str, int]) -> None:
        self.listener = listener
        self.group = group
        self.nr = syscalls
        self.names = {syscalls[name]: name for name in ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")}

    def serve(self) -> None:
        note = Notification()
        while True:
            ctypes.memset(ctypes.byref(note), 0, ctypes.sizeof(note))
            if _libc.ioctl(self.listener, ctypes.c_ulong(NOTIF_RECV), ctypes.byref(note)) < 0:
                if ctypes.get_errno() in (errno.EINTR, errno.ENOENT):  # ENOENT: its caller died first
                    continue
                return
            error, flags = self.judge(note)
            if self._answer(note.id, error, flags) < 0 and flags:
                self._answer(note.id, errno.EPERM, 0)  # no FLAG_CONTINUE before kernel 5.5

    def judge(self, note: Notification) -> tuple[int, int]:
        """(errno, flags) of the answer: 0 and FLAG_CONTINUE run the syscall as asked."""
        name = self.names.get(note.nr)
        caller = _tgid(note.pid)
        if name is None or caller is None or not self._waiting(note.id):
            return errno.EPERM, 0
        target, args = _int32(note.args[0]), [_int32(a) for a in note.args[1:3]]
        if name == "kill":
            return self._kill_member(target, args[0]), 0
        if target != caller:
            return errno.EPERM, 0
        if name == "tgkill":
            return _errno(_libc.syscall(self.nr["tgkill"], target, args[0], args[1])), 0
        return 0, FLAG_CONTINUE  # a sigqueue to itself: its siginfo is the caller's to give

    def _kill_member(self, pid: int, sig: int) -> int:
        tgid = _tgid(pid)  # kill() of a thread's id signals its process
        if tgid is None:
            return errno.ESRCH
        pidfd = int(_libc.syscall(self.nr["pidfd_open"], tgid, 0))
        if pidfd < 0:
            return errno.ESRCH if ctypes.get_errno() == errno.ESRCH else errno.EPERM  # ENOSYS: before 5.3
        try:
            if _pgrp(tgid) != self.group:
                return errno.EPERM
            return _errno(_libc.syscall(self.nr["pidfd_send_signal"], pidfd, sig, None, 0))
        finally:
            os.close(pidfd)

    def _waiting(self, note_id: int) -> bool:
        """Whether the caller still waits: then the pid read from its notification was its own."""
        note = ctypes.c_uint64(note_id)
        return int(_libc.ioctl(self.listener, ctypes.c_ulong(NOTIF_ID_VALID), ctypes.byref(note))) == 0

    def _answer(self, note_id: int, error: int, flags: int) -> int:
        answer = Answer(note_id, 0, -error, flags)
        return int(_libc.ioctl(self.listener, ctypes.c_ulong(NOTIF_SEND), ctypes.byref(answer)))


def _int32(word: int) -> int:
    """A pid_t or int argument: the low 32 bits, signed."""
    word &= 0xFFFFFFFF
    return word - (1 << 32) if word & 0x80000000 else word


def _errno(result: int) -> int:
    return ctypes.get_errno() if result < 0 else 0


def _tgid(pid: int) -> int | None:
    """The process (thread group) of a process or thread id, None if there is none."""
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _pgrp(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[2])
    except (OSError, ValueError, IndexError):
        return None


def _send_fd(sock: socket.socket, fd: int) -> None:
    sock.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))])


def _receive_fd(sock: socket.socket) -> int:
    """The descriptor the other end sends, -1 if it closes without one."""
    _, ancillary, _, _ = sock.recvmsg(1, socket.CMSG_SPACE(struct.calcsize("i")))
    for level, kind, data in ancillary:
        if (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS):
            return int(struct.unpack("i", data[: struct.calcsize("i")])[0])
    return -1


def run(config: dict[str, Any]) -> dict[str, Any]:
    """Fork the code into a process group of its own, harden it there and exec its interpreter
    with an empty environment. Judge the signals it sends beyond its group (a thread of this
    process), kill that whole group when the code's main process ends or on SIGTERM (the service's
    timeout), and reap every process before reporting: as a subreaper (or pid 1 of a pid namespace)
    this process inherits the orphans, so nothing outlives the call."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_DUMPABLE, 0)
    setup_r, setup_w = os.pipe()  # close-on-exec: end-of-file once the code's interpreter runs
    # The code's side hands over the filter's listener, before its exec.
    keeper_end, code_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
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
            keeper_end.close()
            os.setpgid(0, 0)
            listener = harden(config, os.getpid())
            if listener >= 0:
                _send_fd(code_end, listener)
                os.close(listener)  # the code must never answer its own notifications
            code_end.close()
            os.execve(config["python"], [config["python"], "-I", config["main"]], {})
        except OSError as err:
            os.write(setup_w, str(err).encode())
        finally:
            os._exit(127)
    os.close(setup_w)
    code_end.close()
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # also here, so that the group exists before a SIGTERM can ask for its end
    code["pid"] = pid
    if code["stop"]:
        _kill_group(pid)
    listener = _receive_fd(keeper_end)
    keeper_end.close()
    if listener >= 0:
        signals = Signals(listener, pid, config["seccomp"]["syscalls"])
        threading.Thread(target=signals.serve, name="signals", daemon=True).start()
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
    # Now, not after the interpreter's shutdown: the signals thread waits in an ioctl for good.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
