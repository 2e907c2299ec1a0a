"""The sandbox's parts: the seccomp program, output caps, exit statuses, collecting produced files,
the call's arguments, settings; and a run whose caller goes away (in process, real children)."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from antwort_grpc.tool_services.sandbox import SandboxSettings
from antwort_grpc.tool_services.sandbox.budget import PAGE, Usage, code_usage
from antwort_grpc.tool_services.sandbox.isolation import NAMESPACE_FLAGS, Isolation
from antwort_grpc.tool_services.sandbox.limits import Limits, read_capped
from antwort_grpc.tool_services.sandbox.output import collect_files, exit_status
from antwort_grpc.tool_services.sandbox.seccomp import (
    ARCHES,
    RET_ALLOW,
    RET_ERRNO,
    RET_KILL_PROCESS,
    RET_USER_NOTIF,
    program,
    resolve,
)
from antwort_grpc.tool_services.sandbox.service import _code, prepare_runner
from antwort_grpc.tool_services.sandbox.session import Stat, end_session, parse_stat
from antwort_grpc.tool_services.sandbox.session import read_stat as session_stat

# Root hands the code to uid 65534, which cannot reach an interpreter under /root (pyenv, say).
PYTHON = "/usr/bin/python3" if os.geteuid() == 0 else sys.executable


def run_bpf(prog: list[tuple[int, int, int, int]], arch: int, nr: int, *args: int) -> int:
    """Classic BPF, the instructions the program uses, over seccomp_data {nr, arch, args[]}."""
    data = {0: nr, 4: arch}
    for i, arg in enumerate((*args, 0, 0, 0, 0, 0, 0)[:6]):
        data[16 + 8 * i], data[20 + 8 * i] = arg & 0xFFFFFFFF, (arg >> 32) & 0xFFFFFFFF
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        if code == 0x20:  # ld [k]
            acc = data[k]
        elif code == 0x54:  # and k
            acc &= k
        elif code in (0x15, 0x35):  # jeq / jge k
            taken = acc == k if code == 0x15 else acc >= k
            pc += jt if taken else jf
        elif code == 0x06:  # ret k
            return k
        pc += 1


X86_64, AARCH64 = ARCHES["x86_64"].audit, ARCHES["aarch64"].audit
GROUP = 777  # the code's process group in these programs


def seccomp_program(
    machine: str, *, notify: bool = True, count_all_memory: bool = False
) -> list[tuple[int, int, int, int]]:
    return resolve(program(machine, notify=notify, count_all_memory=count_all_memory), GROUP)


@pytest.mark.parametrize(
    ("machine", "arch", "nr", "action"),
    [
        ("x86_64", X86_64, 41, RET_ERRNO | errno.EACCES),  # socket
        ("x86_64", X86_64, 425, RET_ERRNO | errno.EPERM),  # io_uring_setup
        ("x86_64", X86_64, 112, RET_ERRNO | errno.EPERM),  # setsid
        ("x86_64", X86_64, 109, RET_ERRNO | errno.EPERM),  # setpgid
        ("x86_64", X86_64, 0x40000000 | 41, RET_ERRNO | errno.ENOSYS),  # socket through the x32 ABI
        ("x86_64", X86_64, 0, RET_ALLOW),  # read
        ("x86_64", X86_64, 57, RET_ALLOW),  # fork
        ("x86_64", 0x40000003, 102, RET_KILL_PROCESS),  # i386 socketcall from a 64-bit process
        ("aarch64", AARCH64, 198, RET_ERRNO | errno.EACCES),  # socket
        ("aarch64", AARCH64, 157, RET_ERRNO | errno.EPERM),  # setsid
        ("aarch64", AARCH64, 63, RET_ALLOW),  # read
        ("aarch64", 0x40000028, 281, RET_KILL_PROCESS),  # arm32 socket
    ],
)
def test_the_seccomp_filter_denies_sockets_and_leaving_the_process_group(
    machine: str, arch: int, nr: int, action: int
) -> None:
    assert run_bpf(seccomp_program(machine), arch, nr) == action


SERVICE, KEEPER = 4242, 77
PERM, NOTIFY = RET_ERRNO | errno.EPERM, RET_USER_NOTIF


@pytest.mark.parametrize(
    ("machine", "arch", "nr", "args", "with_keeper", "without_keeper"),
    [
        ("x86_64", X86_64, 62, (0, 9), RET_ALLOW, RET_ALLOW),  # kill(its own group)
        ("x86_64", X86_64, 62, (GROUP, 9), RET_ALLOW, RET_ALLOW),  # kill(the group's leader: the code)
        ("x86_64", X86_64, 62, (-GROUP, 9), RET_ALLOW, RET_ALLOW),  # kill(-its own group)
        ("x86_64", X86_64, 62, (GROUP | 1 << 32, 9), RET_ALLOW, RET_ALLOW),  # pid_t is the low word
        ("x86_64", X86_64, 62, (1234, 9), NOTIFY, PERM),  # kill(a pid: its child, or the service)
        ("x86_64", X86_64, 62, (SERVICE, 0), NOTIFY, PERM),  # kill(service, 0): a probe
        ("x86_64", X86_64, 62, (KEEPER, 9), NOTIFY, PERM),
        ("x86_64", X86_64, 62, (-SERVICE, 9), PERM, PERM),  # kill(another group)
        ("x86_64", X86_64, 62, (-KEEPER, 9), PERM, PERM),
        ("x86_64", X86_64, 62, (-1, 0), PERM, PERM),  # kill(every process)
        ("x86_64", X86_64, 234, (GROUP, 778, 6), RET_ALLOW, RET_ALLOW),  # tgkill(the code, a thread of it)
        ("x86_64", X86_64, 234, (SERVICE, 4243, 9), NOTIFY, PERM),  # tgkill(service, a thread)
        ("x86_64", X86_64, 129, (GROUP, 10, 0x1000), RET_ALLOW, RET_ALLOW),  # rt_sigqueueinfo(the code)
        ("x86_64", X86_64, 129, (SERVICE, 9, 0x1000), NOTIFY, PERM),
        ("x86_64", X86_64, 297, (SERVICE, 4243, 9, 0x1000), NOTIFY, PERM),  # rt_tgsigqueueinfo
        ("x86_64", X86_64, 200, (5, 9), PERM, PERM),  # tkill: any thread
        ("x86_64", X86_64, 424, (3, 9), PERM, PERM),  # pidfd_send_signal
        ("x86_64", X86_64, 434, (GROUP, 0), PERM, PERM),  # pidfd_open, even of its own
        ("x86_64", X86_64, 72, (3, 8, SERVICE), PERM, PERM),  # fcntl(F_SETOWN)
        ("x86_64", X86_64, 72, (3, 10, 9), PERM, PERM),  # fcntl(F_SETSIG)
        ("x86_64", X86_64, 72, (3, 15, 0x1000), PERM, PERM),  # fcntl(F_SETOWN_EX)
        ("x86_64", X86_64, 72, (3, 4, 0x800), RET_ALLOW, RET_ALLOW),  # fcntl(F_SETFL): the others stay
        ("x86_64", X86_64, 16, (3, 0x8901, 0x1000), PERM, PERM),  # ioctl(FIOSETOWN)
        ("x86_64", X86_64, 16, (3, 0x8902, 0x1000), PERM, PERM),  # ioctl(SIOCSPGRP)
        ("x86_64", X86_64, 16, (1, 0x5401, 0x1000), RET_ALLOW, RET_ALLOW),  # ioctl(TCGETS)
        ("x86_64", X86_64, 0, (SERVICE,), RET_ALLOW, RET_ALLOW),  # read(fd 4242): only what is named is checked
        ("aarch64", AARCH64, 129, (SERVICE, 9), NOTIFY, PERM),  # kill(service)
        ("aarch64", AARCH64, 129, (-SERVICE, 9), PERM, PERM),
        ("aarch64", AARCH64, 129, (0, 9), RET_ALLOW, RET_ALLOW),
        ("aarch64", AARCH64, 131, (SERVICE, 4243, 9), NOTIFY, PERM),  # tgkill
        ("aarch64", AARCH64, 25, (3, 8, SERVICE), PERM, PERM),  # fcntl(F_SETOWN)
        ("aarch64", AARCH64, 29, (3, 0x8901, 0x1000), PERM, PERM),  # ioctl(FIOSETOWN)
    ],
)
def test_the_seccomp_filter_keeps_signals_within_the_codes_own_group(
    machine: str, arch: int, nr: int, args: tuple[int, ...], with_keeper: int, without_keeper: int
) -> None:
    """What the filter cannot judge goes to the keeper; without one (a kernel before 5.0) it is
    refused."""
    assert run_bpf(seccomp_program(machine), arch, nr, *args) == with_keeper
    assert run_bpf(seccomp_program(machine, notify=False), arch, nr, *args) == without_keeper


MAP_SHARED_ANON, MAP_PRIVATE_ANON = 0x21, 0x22


@pytest.mark.parametrize(
    ("machine", "arch", "nr", "args", "watcher", "cgroup"),
    [
        ("x86_64", X86_64, 319, (0x1000, 0), PERM, RET_ALLOW),  # memfd_create
        ("x86_64", X86_64, 447, (0,), PERM, RET_ALLOW),  # memfd_secret
        ("x86_64", X86_64, 9, (0, 1 << 20, 3, MAP_SHARED_ANON, -1, 0), PERM, RET_ALLOW),  # mmap shared anonymous
        ("x86_64", X86_64, 9, (0, 1 << 20, 3, 0x23, -1, 0), PERM, RET_ALLOW),  # MAP_SHARED_VALIDATE|MAP_ANONYMOUS
        ("x86_64", X86_64, 9, (0, 1 << 20, 3, MAP_PRIVATE_ANON | 0x4000, -1, 0), RET_ALLOW, RET_ALLOW),  # malloc's
        ("x86_64", X86_64, 9, (0, 1 << 20, 1, 0x01, 3, 0), RET_ALLOW, RET_ALLOW),  # a file, shared
        ("x86_64", X86_64, 29, (0, 1 << 20, 0o1600), PERM, PERM),  # shmget: always
        ("x86_64", X86_64, 30, (5, 0, 0), PERM, PERM),  # shmat of a host segment
        ("x86_64", X86_64, 68, (0, 0o1600), PERM, PERM),  # msgget
        ("x86_64", X86_64, 64, (0, 1, 0o1600), PERM, PERM),  # semget
        ("x86_64", X86_64, 240, (0x1000, 0o100, 0o600, 0), PERM, PERM),  # mq_open
        ("x86_64", X86_64, 278, (4, 0x1000, 1, 0), PERM, RET_ALLOW),  # vmsplice: a page into a pipe
        ("x86_64", X86_64, 275, (3, 0, 4, 0, 1, 0), PERM, RET_ALLOW),  # splice: a file's page into a pipe
        ("x86_64", X86_64, 276, (3, 4, 1, 0), PERM, RET_ALLOW),  # tee: a pipe's references into another
        ("x86_64", X86_64, 40, (4, 3, 0, 1), PERM, RET_ALLOW),  # sendfile: into a pipe, as splice does
        ("x86_64", X86_64, 1, (4, 0x1000, 1), RET_ALLOW, RET_ALLOW),  # write into a pipe: a copy
        ("aarch64", AARCH64, 279, (0x1000, 0), PERM, RET_ALLOW),  # memfd_create
        ("aarch64", AARCH64, 222, (0, 1 << 20, 3, MAP_SHARED_ANON, -1, 0), PERM, RET_ALLOW),
        ("aarch64", AARCH64, 222, (0, 1 << 20, 3, MAP_PRIVATE_ANON, -1, 0), RET_ALLOW, RET_ALLOW),
        ("aarch64", AARCH64, 194, (0, 1 << 20, 0o1600), PERM, PERM),  # shmget
        ("aarch64", AARCH64, 75, (4, 0x1000, 1, 0), PERM, RET_ALLOW),  # vmsplice
        ("aarch64", AARCH64, 76, (3, 0, 4, 0, 1, 0), PERM, RET_ALLOW),  # splice
        ("aarch64", AARCH64, 77, (3, 4, 1, 0), PERM, RET_ALLOW),  # tee
        ("aarch64", AARCH64, 71, (4, 3, 0, 1), PERM, RET_ALLOW),  # sendfile
    ],
)
def test_memory_the_watcher_cannot_see_is_refused_unless_a_cgroup_counts_it(
    machine: str, arch: int, nr: int, args: tuple[int, ...], watcher: int, cgroup: int
) -> None:
    assert run_bpf(seccomp_program(machine), arch, nr, *args) == watcher
    assert run_bpf(seccomp_program(machine, count_all_memory=True), arch, nr, *args) == cgroup


ACCES = RET_ERRNO | errno.EACCES


@pytest.mark.parametrize(
    ("machine", "arch", "nr", "args", "action"),
    [
        ("x86_64", X86_64, 302, (0, 7, 0, 0), RET_ALLOW),  # prlimit64(self): what setrlimit does
        ("x86_64", X86_64, 302, (SERVICE, 0, 1, 0), PERM),  # prlimit64(service)
        ("x86_64", X86_64, 141, (0, 0, 19), RET_ALLOW),  # setpriority(PRIO_PROCESS, self)
        ("x86_64", X86_64, 141, (0, SERVICE, 19), PERM),  # setpriority(PRIO_PROCESS, service)
        ("x86_64", X86_64, 141, (2, 0, 19), PERM),  # setpriority(PRIO_USER, own uid): every process of it
        ("x86_64", X86_64, 141, (1, 0, 19), PERM),  # setpriority(PRIO_PGRP, own group)
        ("x86_64", X86_64, 203, (0, 8, 1), RET_ALLOW),  # sched_setaffinity(self)
        ("x86_64", X86_64, 203, (SERVICE, 8, 1), PERM),
        ("x86_64", X86_64, 144, (SERVICE, 5, 0), PERM),  # sched_setscheduler(service, SCHED_IDLE)
        ("x86_64", X86_64, 142, (SERVICE, 0), PERM),  # sched_setparam
        ("x86_64", X86_64, 314, (SERVICE, 0, 0), PERM),  # sched_setattr
        ("x86_64", X86_64, 251, (1, 0, 7), RET_ALLOW),  # ioprio_set(IOPRIO_WHO_PROCESS, self)
        ("x86_64", X86_64, 251, (1, SERVICE, 7), PERM),
        ("x86_64", X86_64, 251, (3, 0, 7), PERM),  # ioprio_set(IOPRIO_WHO_USER, own uid)
        ("x86_64", X86_64, 101, (16, SERVICE), PERM),  # ptrace(PTRACE_ATTACH, service)
        ("x86_64", X86_64, 310, (SERVICE,), PERM),  # process_vm_readv
        ("x86_64", X86_64, 53, (1, 1 | 0x80000, 0), RET_ALLOW),  # socketpair(AF_UNIX, SOCK_STREAM|CLOEXEC)
        ("x86_64", X86_64, 53, (1, 2, 0), ACCES),  # socketpair(AF_UNIX, SOCK_DGRAM)
        ("x86_64", X86_64, 53, (1, 5 | 0x800, 0), ACCES),  # socketpair(AF_UNIX, SOCK_SEQPACKET|NONBLOCK)
        ("x86_64", X86_64, 44, (3, 0x1000, 5, 0, 0, 0), RET_ALLOW),  # sendto(fd, buf, n, 0, NULL, 0): send
        ("x86_64", X86_64, 44, (3, 0x1000, 5, 0, 0x7FFF0000, 20), ACCES),  # sendto(..., path address)
        ("x86_64", X86_64, 44, (3, 0x1000, 5, 0, 0x7F0000000000, 20), ACCES),  # address above 4 GiB
        ("x86_64", X86_64, 42, (3, 0x1000, 20), ACCES),  # connect
        ("x86_64", X86_64, 49, (3, 0x1000, 20), ACCES),  # bind
        ("aarch64", AARCH64, 261, (SERVICE, 0, 1, 0), PERM),  # prlimit64(service)
        ("aarch64", AARCH64, 261, (0, 0, 1, 0), RET_ALLOW),
        ("aarch64", AARCH64, 199, (1, 2, 0), ACCES),  # socketpair(AF_UNIX, SOCK_DGRAM)
        ("aarch64", AARCH64, 206, (3, 0x1000, 5, 0, 0x7FFF0000, 20), ACCES),  # sendto(path)
    ],
)
def test_the_seccomp_filter_keeps_the_code_from_acting_on_other_processes_or_host_sockets(
    machine: str, arch: int, nr: int, args: tuple[int, ...], action: int
) -> None:
    assert run_bpf(seccomp_program(machine), arch, nr, *args) == action


def test_an_architecture_without_a_filter_is_refused() -> None:
    with pytest.raises(OSError, match="no seccomp filter"):
        program("riscv64")


async def test_output_past_the_cap_is_discarded_and_reported_once() -> None:
    stream = asyncio.StreamReader()
    for chunk in (b"abcdef", b"ghijkl", b"mnop"):
        stream.feed_data(chunk)
    stream.feed_eof()
    overflows: list[None] = []
    captured = await read_capped(stream, 8, lambda: overflows.append(None))
    assert (captured.data, captured.truncated, len(overflows)) == (b"abcdefgh", True, 1)


async def test_output_within_the_cap_is_kept_whole() -> None:
    stream = asyncio.StreamReader()
    stream.feed_data("grüße\n".encode())
    stream.feed_eof()
    captured = await read_capped(stream, 1024, lambda: pytest.fail("no overflow"))
    assert (captured.text(), captured.truncated) == ("grüße\n", False)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (0, (0, None, None)),
        (3, (3, None, None)),
        (-9, (None, "SIGKILL", None)),
        (-11, (None, "SIGSEGV", None)),
        (-24, (None, "SIGXCPU", "cpu")),
        (-25, (None, "SIGXFSZ", "file_size")),
    ],
)
def test_an_exit_status_says_code_signal_and_limit(status: int, expected: tuple[object, ...]) -> None:
    assert exit_status(status) == expected


def test_the_rlimits_follow_the_settings() -> None:
    limits = Limits.from_settings(SandboxSettings(cpu_seconds=3, memory_mb=128, max_processes=5))
    table = {name: (soft, hard) for name, soft, hard in limits.rlimits()}
    assert table["RLIMIT_CPU"] == (3, 4)
    assert table["RLIMIT_AS"] == (128 << 20, 128 << 20)
    assert table["RLIMIT_NPROC"] == (5, 5)
    assert table["RLIMIT_CORE"] == (0, 0)


def test_collected_files_are_regular_files_of_the_code_in_path_order(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.bin").write_bytes(b"\x00\xff")
    (tmp_path / "a.txt").write_text("text")
    (tmp_path / "link").symlink_to("/etc/passwd")
    os.mkfifo(tmp_path / "fifo")
    files, not_listed = collect_files(str(tmp_path), owner=os.geteuid(), max_files=10, max_bytes=100)
    assert [(f.path, f.size, f.content) for f in files] == [("a.txt", 4, b"text"), ("sub/b.bin", 2, b"\x00\xff")]
    assert not_listed == 0
    assert files[1].to_json() == {"path": "sub/b.bin", "size": 2, "encoding": "base64", "content": "AP8="}


def test_collected_files_respect_the_count_and_the_size_budget(tmp_path: Path) -> None:
    for name, size in (("1.txt", 5), ("2.txt", 50), ("3.txt", 5), ("4.txt", 1)):
        (tmp_path / name).write_text("x" * size)
    files, not_listed = collect_files(str(tmp_path), owner=os.geteuid(), max_files=3, max_bytes=20)
    assert [(f.path, f.content is not None) for f in files] == [("1.txt", True), ("2.txt", False), ("3.txt", True)]
    assert files[1].to_json()["omitted"]
    assert not_listed == 1


def test_files_of_another_owner_are_not_collected(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("text")
    assert collect_files(str(tmp_path), owner=os.geteuid() + 1, max_files=10, max_bytes=100) == ([], 0)


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ('{"code": "print(1)"}', None),
        ("print(1)", "not valid JSON"),
        ('{"code": 1}', '"code"'),
        ('{"code": "  "}', '"code"'),
        ("[]", '"code"'),
        ('{"code": "' + "x" * 101 + '"}', "longer than 100 bytes"),
        ('{"code": "x = 1  # \\udc80"}', "lone surrogate (\\udc80 at character 9)"),
    ],
)
def test_the_arguments_must_carry_the_code(arguments: str, problem: str | None) -> None:
    code = _code(arguments, 100)
    if problem is None:
        assert code == "print(1)"
    else:
        assert not isinstance(code, str)
        assert code.is_error and problem in code.output


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTWORT_SANDBOX_READ_PATHS", "/opt/data, /srv/models")
    monkeypatch.setenv("ANTWORT_SANDBOX_MAX_CONCURRENCY", "2")
    settings = SandboxSettings()
    assert (settings.read_paths, settings.max_concurrency) == (["/opt/data", "/srv/models"], 2)
    monkeypatch.setenv("ANTWORT_SANDBOX_NAMESPACES", "sometimes")
    with pytest.raises(ValidationError):
        SandboxSettings()


def test_the_command_drops_root_before_entering_the_namespaces() -> None:
    isolation = Isolation("/usr/bin/python3", "/usr/bin/unshare", 7, 65534, ("/usr",), "/usr/bin/setpriv")
    argv = isolation.command([("RLIMIT_CPU", 1, 2)], "/tmp/r", "/tmp/r/work", "/tmp/r/main.py", 9)
    assert argv[:5] == ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    assert argv[5 : 6 + len(NAMESPACE_FLAGS)] == ["/usr/bin/unshare", *NAMESPACE_FLAGS]
    config = json.loads(argv[-1])
    assert config["status_fd"] == 9
    assert config["landlock"]["write"] == ["/tmp/r/work"]
    assert config["landlock"]["read"] == ["/usr", "/tmp/r", "/proc"]  # the namespace's own /proc


@pytest.mark.parametrize("count_all_memory", [False, True])
def test_the_command_carries_the_filter_for_how_the_memory_budget_is_held(count_all_memory: bool) -> None:
    isolation = Isolation("/usr/bin/python3", None, 5, None, ("/usr",))
    argv = isolation.command([], "/tmp/r", "/tmp/r/work", "/tmp/r/main.py", 9, count_all_memory=count_all_memory)
    config = json.loads(argv[-1])
    machine = os.uname().machine
    assert config["seccomp"]["program"] == [list(i) for i in program(machine, count_all_memory=count_all_memory)]
    assert config["seccomp"]["without_keeper"] == [
        list(i) for i in program(machine, notify=False, count_all_memory=count_all_memory)
    ]
    assert "/dev/zero" not in config["landlock"]["devices"]  # readable only: see SYSTEM_READ_PATHS


def test_the_fallback_command_has_no_namespaces_and_no_proc() -> None:
    isolation = Isolation("/usr/bin/python3", None, 7, None, ("/usr",))
    argv = isolation.command([], "/tmp/r", "/tmp/r/work", "/tmp/r/main.py", 9)
    assert argv[:4] == ["/usr/bin/python3", "-I", "-S", "-c"]
    assert json.loads(argv[-1])["landlock"]["read"] == ["/usr", "/tmp/r"]
    assert isolation.network == "seccomp"


@pytest.fixture
def workdir_root() -> Iterator[Path]:
    # Under /tmp and open to others: the code may run as another uid than these tests.
    root = Path(tempfile.mkdtemp(prefix="antwort-sandbox-parts-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root)


@pytest.mark.parametrize("namespaces", ["auto", "off"])
async def test_a_run_whose_caller_goes_away_kills_the_code_and_removes_its_directory(
    namespaces: str, workdir_root: Path
) -> None:
    settings = SandboxSettings(python=PYTHON, namespaces=namespaces, workdir_root=str(workdir_root))
    runner = await prepare_runner(settings, Limits.from_settings(settings))
    started = asyncio.Event()
    code = "import subprocess, time\nsubprocess.Popen(['sleep', '1000'])\ntime.sleep(1000)"
    run = asyncio.create_task(runner.run(code, lambda message: started.set()))
    await started.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert _in(workdir_root) == []
    assert _processes_in(workdir_root) == []


def _in(path: Path) -> list[str]:
    return os.listdir(path)


def _processes_in(root: Path) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd").startswith(str(root)):
                found.append(pid)
        except OSError:
            continue
    return found


def test_what_is_left_of_a_session_is_killed_whoever_its_parent_is() -> None:
    """An orphan (its parent, the session's leader, gone: as when a keeper dies) is found by its
    session and killed."""
    leader = subprocess.Popen(
        ["sh", "-c", "sleep 1000 & echo $!"], stdout=subprocess.PIPE, start_new_session=True, text=True
    )
    assert leader.stdout is not None
    orphan = int(leader.stdout.readline())
    leader.wait()
    assert os.getsid(orphan) == leader.pid
    assert end_session(leader.pid) == 1
    assert end_session(leader.pid) == 0  # killed: gone, or a zombie that its new parent collects
    stat = session_stat(orphan)
    assert stat is None or stat.state == "Z"


def test_a_stat_line_is_read_past_a_command_name_with_spaces_and_parentheses() -> None:
    # After the name: state, ppid, pgrp, session, then 16 fields, vsize and rss (the 24th field).
    line = "4242 (evil) 1 2 3 (x) S 1 777 700 " + " ".join(["0"] * 16) + " 4096 93 18446744073709551615\n"
    assert parse_stat(line) == Stat("S", 777, 700, 93)


def test_the_code_usage_counts_the_session_outside_its_leaders_group(tmp_path: Path) -> None:
    def stat(pid: int, pgrp: int, sid: int, pages: int) -> None:
        (tmp_path / str(pid)).mkdir()
        fields = ["S", "1", str(pgrp), str(sid), *["0"] * 17, str(pages)]
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (python3) " + " ".join(fields))

    stat(700, 700, 700, 1000)  # the keeper: the session's leader group
    stat(777, 777, 700, 2000)  # the code
    stat(778, 777, 700, 3000)  # its child
    stat(900, 900, 900, 9999)  # another call
    (tmp_path / "self").mkdir()
    assert code_usage(700, str(tmp_path)) == Usage(5000 * PAGE, 2)
