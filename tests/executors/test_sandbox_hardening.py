"""The sandbox service as a real process, attacked the way a hostile program would: acting on the
service or on another call's processes, holding shared memory or pages pinned in pipes that the
budget cannot see, reaching a host socket, nesting directories past Python's recursion limit; and
a keeper killed from outside.
Three services: namespaces (the service as root, the code as uid 65534), the fallback as root,
and the fallback with the code on the service's own uid (a non-root service, as in a pod whose
seccomp profile forbids user namespaces). Signals: test_sandbox_signals.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from antwort_grpc import pb
from tests.executors.test_sandbox import ROOT, Sandbox, _request, _start, _stub, run

AS_ROOT = os.geteuid() == 0
# As root: the service on uid 1000 with nothing but CAP_DAC_OVERRIDE kept (so that it can run the
# test machine's interpreter under /root); the code it starts gets no capability and the same uid.
# As a normal user: the service on that user's uid, as it is.
SAME_UID = 1000 if AS_ROOT else os.getuid()
AS_SAME_UID: tuple[str, ...] = (
    (
        "setpriv",
        f"--reuid={SAME_UID}",
        f"--regid={SAME_UID}",
        "--clear-groups",
        "--inh-caps=+dac_override",
        "--ambient-caps=+dac_override",
    )
    if AS_ROOT
    else ()
)
ROOT_ONLY = pytest.mark.skipif(
    not AS_ROOT, reason="a service started as root (the code on another uid); the suite runs as root in CI"
)
MODES = ("namespaces", "fallback", "fallback_same_uid")


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Sandbox]]:
    tmp = tmp_path_factory.mktemp("hardening")
    started = [
        _start(tmp, "namespaces", timeout_seconds="30", cpu_seconds="10", max_code_bytes=str(8 * 1024 * 1024)),
        _start(tmp, "fallback", namespaces="off", timeout_seconds="30", cpu_seconds="10"),
        # The process limit counts the uid's, the service's threads included.
        _start(
            tmp,
            "same-uid",
            AS_SAME_UID,
            namespaces="off",
            timeout_seconds="30",
            cpu_seconds="10",
            # On a normal user's uid (no wrapper), `_start` sizes the limit for what that uid runs.
            **({"max_processes": "64"} if AS_ROOT else {}),
        ),
    ]
    try:
        yield {mode: next(gen) for mode, gen in zip(MODES, started, strict=True)}
    finally:
        for gen in started:
            next(gen, None)


@pytest.fixture(params=MODES)
def box(request: pytest.FixtureRequest, services: dict[str, Sandbox]) -> Sandbox:
    return services[request.param]


@pytest.fixture
async def stub(box: Sandbox) -> AsyncIterator[pb.ToolExecutorServiceStub]:
    async for s in _stub(box):
        yield s


def test_the_same_uid_service_runs_the_code_on_its_own_uid(services: dict[str, Sandbox]) -> None:
    """The premise of the same-uid attacks below."""
    box = services["fallback_same_uid"]
    assert os.stat(f"/proc/{box.pid}").st_uid == SAME_UID
    assert f"uid: {SAME_UID} (the service's)" in box.log.read_text()


async def test_5_mb_of_code_is_accepted(services: dict[str, Sandbox]) -> None:
    """The executor's message limits are the gateway's (32 MiB), not gRPC's default 4 MiB."""
    code = "# " + "x" * (5 * 1000 * 1000) + "\nprint('the big one ran')"
    async for stub in _stub(services["namespaces"]):
        result = await run(stub, code)
    assert result.output["stdout"] == "the big one ran\n"


# Acting on the service or on another call.

_libc = ctypes.CDLL(None, use_errno=True)
IOPRIO_GET = {"x86_64": 252, "aarch64": 31}[os.uname().machine]
ATTACK = """
import ctypes, json, os, resource
libc = ctypes.CDLL(None, use_errno=True)
IOPRIO_SET = {{"x86_64": 251, "aarch64": 30}}[os.uname().machine]
IDLE = 3 << 13
results = []

def attempt(what, action):
    try:
        if action() == -1:
            raise OSError(ctypes.get_errno(), "")
        results.append([what, "done"])
    except OSError as err:
        results.append([what, os.strerror(err.errno) if err.errno else str(err)])

for pid in {pids}:
    attempt(f"prlimit cpu {{pid}}", lambda: resource.prlimit(pid, resource.RLIMIT_CPU, (1, 1)))
    attempt(f"prlimit nofile {{pid}}", lambda: resource.prlimit(pid, resource.RLIMIT_NOFILE, (3, 3)))
    attempt(f"setpriority {{pid}}", lambda: os.setpriority(os.PRIO_PROCESS, pid, 19))
    attempt(f"sched_setaffinity {{pid}}", lambda: os.sched_setaffinity(pid, {{0}}))
    attempt(f"sched_setscheduler {{pid}}", lambda: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0)))
    attempt(f"ioprio_set {{pid}}", lambda: libc.syscall(IOPRIO_SET, 1, pid, IDLE))
attempt("setpriority of the whole uid", lambda: os.setpriority(os.PRIO_USER, 0, 19))
attempt("setpriority of the service's group", lambda: os.setpriority(os.PRIO_PGRP, {service}, 19))
attempt("ioprio_set of the whole uid", lambda: libc.syscall(IOPRIO_SET, 3, 0, IDLE))
attempt("ioprio_set of the service's group", lambda: libc.syscall(IOPRIO_SET, 2, {service}, IDLE))
# What stays allowed: the code's own limits, priority and affinity.
attempt("own limit", lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32)))
attempt("own priority", lambda: os.setpriority(os.PRIO_PROCESS, 0, 5))
attempt("own affinity", lambda: os.sched_setaffinity(0, os.sched_getaffinity(0)))
print(json.dumps(results))
"""


@dataclass(frozen=True)
class ProcessState:
    limits: str
    nice: int
    affinity: frozenset[int]
    scheduler: int
    ioprio: int


def state(pid: int) -> ProcessState:
    ioprio = _libc.syscall(IOPRIO_GET, 1, pid)
    return ProcessState(
        Path(f"/proc/{pid}/limits").read_text(),
        os.getpriority(os.PRIO_PROCESS, pid),
        frozenset(os.sched_getaffinity(pid)),
        os.sched_getscheduler(pid),
        ioprio,
    )


def alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def threads(pid: int) -> list[int]:
    return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))


def code_processes(box: Sandbox) -> list[int]:
    """The running code's processes (the interpreter running main.py) of the service's calls."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if cwd.startswith(str(box.workdir_root)) and cmdline[-2:-1] and cmdline[-2].endswith(b"main.py"):
            found.append(int(pid))
    return found


async def until(check: Callable[[], object], timeout: float = 15.0) -> None:
    """Poll other processes' state (which sends no event) until `check` holds."""
    async with asyncio.timeout(timeout):
        while not check():  # noqa: ASYNC110 - /proc offers nothing to await
            await asyncio.sleep(0.02)


async def test_code_cannot_change_limits_priority_or_scheduling_of_the_service_or_another_call(
    stub: pb.ToolExecutorServiceStub, box: Sandbox
) -> None:
    victim = stub.Execute(_request("import time\ntime.sleep(1000)", call_id="victim"))
    assert (await victim.read()).progress.message == "started"
    await until(lambda: code_processes(box))
    victims = code_processes(box)
    targets = [box.pid, *threads(box.pid), *victims]
    before = {pid: state(pid) for pid in targets}

    attack = await run(stub, ATTACK.format(pids=sorted(set(targets)), service=os.getpgid(box.pid)))

    outcomes = dict(json.loads(attack.output["stdout"].splitlines()[-1]))
    attacks = {k: v for k, v in outcomes.items() if not k.startswith("own ")}
    assert attacks and all(v != "done" for v in attacks.values()), attacks
    assert all(outcomes[k] == "done" for k in ("own limit", "own priority", "own affinity")), outcomes
    if box.log.name.startswith("same-uid"):
        # On the service's own uid only the filter stands in the way: it says EPERM.
        assert set(attacks.values()) == {"Operation not permitted"}, attacks
    for pid, was in before.items():
        if alive(pid):  # a thread of the service may have ended meanwhile
            assert state(pid) == was, pid
    assert code_processes(box) == victims  # the other call still runs
    victim.cancel()
    after = await run(stub, "print(6 * 7)")
    assert after.output["stdout"] == "42\n"


# Host sockets.

REACH_SOCKET = """
import json, socket
path = {path!r}
results = []

def attempt(what, action):
    try:
        action()
        results.append([what, "sent"])
    except OSError as err:
        results.append([what, type(err).__name__])

def dgram_sendto():
    a, _ = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendto(b"dgram sendto", path)

def dgram_connect():
    a, _ = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.connect(path)
    a.send(b"dgram connect")

def seqpacket_sendto():
    a, _ = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    a.sendto(b"seqpacket sendto", path)

def stream_sendto():
    a, _ = socket.socketpair()
    a.sendto(b"stream sendto", path)

def stream_sendmsg():
    a, _ = socket.socketpair()
    a.sendmsg([b"stream sendmsg"], [], 0, path)

def stream_connect():
    a, _ = socket.socketpair()
    a.connect(path)
    a.send(b"stream connect")

for f in (dgram_sendto, dgram_connect, seqpacket_sendto, stream_sendto, stream_sendmsg, stream_connect):
    attempt(f.__name__, f)
a, b = socket.socketpair()  # what multiprocessing and asyncio use stays usable
a.send(b"ping")
results.append(["stream pair", b.recv(4).decode()])
print(json.dumps(results))
"""


@pytest.fixture
def host_socket() -> Iterator[tuple[str, socket.socket]]:
    """A datagram socket like /dev/log, in a directory everyone may enter, open to everyone."""
    directory = tempfile.mkdtemp(prefix="antwort-host-socket-")
    os.chmod(directory, 0o777)
    path = os.path.join(directory, "log")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    os.chmod(path, 0o777)
    try:
        yield path, sock
    finally:
        sock.close()
        os.unlink(path)
        os.rmdir(directory)


async def test_code_cannot_reach_a_host_datagram_socket_by_its_path(
    stub: pb.ToolExecutorServiceStub, box: Sandbox, host_socket: tuple[str, socket.socket]
) -> None:
    path, sock = host_socket
    result = await run(stub, REACH_SOCKET.format(path=path))
    outcomes = dict(json.loads(result.output["stdout"].splitlines()[-1]))
    assert "sent" not in outcomes.values(), outcomes
    assert outcomes["stream pair"] == "ping"
    with pytest.raises(BlockingIOError):
        print(sock.recv(4096, socket.MSG_DONTWAIT))


# Deep directories.

NEST = """
import os
for _ in range({depth}):
    os.mkdir({name!r})
    os.chdir({name!r})
open("bottom.txt", "w").write("deep")
"""


@pytest.mark.parametrize(("depth", "name"), [(1200, "d"), (100, "n" * 200)])
async def test_deeply_nested_directories_return_normally_and_are_removed(
    stub: pb.ToolExecutorServiceStub, box: Sandbox, depth: int, name: str
) -> None:
    result = await run(stub, NEST.format(depth=depth, name=name))
    assert not result.is_error, result.output
    files = result.output["files"]
    if len(name) == 1:  # within PATH_MAX: listed
        assert [f["path"] for f in files] == ["/".join([name] * depth + ["bottom.txt"])]
    else:  # past PATH_MAX: not listed, no failure
        assert files == []
    assert os.listdir(box.workdir_root) == []


async def test_a_deep_tree_the_code_made_unreadable_is_removed(stub: pb.ToolExecutorServiceStub, box: Sandbox) -> None:
    code = "import os\nwork = os.getcwd()\n" + NEST.format(depth=1200, name="d") + "os.chdir(work)\nos.chmod('d', 0)\n"
    result = await run(stub, code)
    assert not result.is_error, result.output
    assert os.listdir(box.workdir_root) == []


# One memory budget per call.

SIX_CHILDREN = """
import os, time
for _ in range(6):
    if os.fork() == 0:
        block = b"\\x01" * (120 * 1024 * 1024)  # written, so resident: 720 MB in all
        time.sleep(1000)
        os._exit(0)
os.wait()
"""


async def test_children_that_allocate_together_past_the_limit_stop_the_call(
    stub: pb.ToolExecutorServiceStub, box: Sandbox
) -> None:
    """Each child stays under its own address-space limit (256 MB here); together they pass the
    call's budget (the same 256 MB)."""
    result = await run(stub, SIX_CHILDREN)
    out = result.output
    assert (out["limit"], out["signal"]) == ("memory", "SIGKILL"), out
    assert out["error"] == "stopped: the code's processes together used more memory than allowed"
    assert code_processes(box) == []
    after = await run(stub, "print(6 * 7)")
    assert after.output["stdout"] == "42\n"


# Shared memory that no process's resident memory shows: four processes each hold 100 MB (400 MB
# against the budget of 256 MB) in 10 MB pieces, none of them resident for long.
HOLD_SHARED = """
import ctypes, mmap, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
PIECE = 1 << 20  # the file size limit of these services: a memfd grows no larger
kept = []

def memfd():
    # Written, mapped, never touched, its descriptor closed: held by the mapping alone.
    fd = os.memfd_create("piece")
    os.write(fd, b"\\1" * PIECE)
    if libc.mmap(None, PIECE, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0) in (None, 2**64 - 1):
        raise OSError(ctypes.get_errno(), "mmap")
    os.close(fd)

def shared_anonymous():
    # Touched, then dropped from the page tables: the pages stay in the shared object.
    kept.append(piece := mmap.mmap(-1, 10 * PIECE, flags=mmap.MAP_SHARED))
    piece.write(b"\\1" * len(piece))
    piece.madvise(mmap.MADV_DONTNEED)

def dev_zero():
    fd = os.open("/dev/zero", os.O_RDWR)  # a shared mapping of it is shared anonymous memory
    kept.append(piece := mmap.mmap(fd, 10 * PIECE, flags=mmap.MAP_SHARED))
    piece.write(b"\\1" * len(piece))
    piece.madvise(mmap.MADV_DONTNEED)

ways = {{"memfd": (memfd, 100), "shared anonymous": (shared_anonymous, 10), "/dev/zero": (dev_zero, 10)}}
hold, count = ways[{kind!r}]
for _ in range(3):
    if os.fork() == 0:
        for _ in range(count):
            hold()
        time.sleep(1)  # ten looks of the watcher
        os._exit(0)
for _ in range(count):
    hold()
print("held 400 MB", flush=True)
time.sleep(1)
for _ in range(3):
    os.wait()
"""


@pytest.mark.parametrize("kind", ["memfd", "shared anonymous", "/dev/zero"])
async def test_shared_memory_the_memory_budget_cannot_see_is_refused(
    stub: pb.ToolExecutorServiceStub, box: Sandbox, kind: str
) -> None:
    """The watcher sums resident memory: memory a memfd or a shared mapping holds without being
    resident cannot be created where it holds the budget (here: no cgroup v2 on these machines)."""
    result = await run(stub, HOLD_SHARED.format(kind=kind))
    out = result.output
    assert "held" not in out["stdout"], out
    assert result.is_error and "PermissionError: [Errno" in out["stderr"], out
    private = await run(stub, "import mmap\nm = mmap.mmap(-1, 1 << 20, flags=mmap.MAP_PRIVATE)\nm.write(b'x')\n")
    assert not private.is_error, private.output


# Pages pinned in pipes: one byte of a transparent huge page spliced into a pipe slot keeps the
# whole 2 MiB page after it is unmapped, resident in no process. 256 slots of a pipe grown to
# 1 MiB hold 512 MB (twice the budget of 256 MB) with about 10 MB resident. The page cache of a
# file does the same through splice or sendfile into a pipe (large folios: xfs, huge tmpfs), and
# tee copies such references from pipe to pipe.
PIN_IN_PIPES = """
import ctypes, fcntl, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.vmsplice.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
libc.tee.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint]
HUGE, SLOTS, MADV_HUGEPAGE, F_SETPIPE_SZ = 2 << 20, 256, 14, 1031

class Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

def check(result, what):
    if result < 0:
        raise OSError(ctypes.get_errno(), what)

def vmsplice(pipe):
    # Its own huge page, touched once, one byte of it spliced, then unmapped.
    raw = libc.mmap(None, 2 * HUGE, 3, 0x22, -1, 0)  # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS
    page = (raw + HUGE - 1) & ~(HUGE - 1)
    libc.madvise(page, HUGE, MADV_HUGEPAGE)
    ctypes.memset(page, 1, 1)
    check(libc.vmsplice(pipe, ctypes.byref(Iovec(page, 1)), 1, 0), "vmsplice")
    libc.munmap(raw, 2 * HUGE)

def from_file(send):
    with open("data", "wb") as f:
        f.write(b"\\1" * (1 << 20))
    fd = os.open("data", os.O_RDONLY)
    os.unlink("data")  # its pages now live only as long as the pipe holds them
    def pin(pipe):
        send(fd, pipe)
    return pin

def tee():
    source_r, source_w = os.pipe()
    os.write(source_w, b"x")
    def pin(pipe):
        check(libc.tee(source_r, pipe, 1, 0), "tee")
    return pin

pin = {{
    "vmsplice": vmsplice,
    "splice": from_file(lambda fd, pipe: os.splice(fd, pipe, 1, offset_src=0)),
    "sendfile": from_file(lambda fd, pipe: os.sendfile(pipe, fd, 0, 1)),
    "tee": tee(),
}}[{kind!r}]
pipes = []
for _ in range(2):
    pipes.append(os.pipe())
    fcntl.fcntl(pipes[-1][1], F_SETPIPE_SZ, SLOTS * 4096)
    for _ in range(SLOTS):
        pin(pipes[-1][1])
print("held", len(pipes) * SLOTS, "references", flush=True)
time.sleep(1)  # ten looks of the watcher
"""


@pytest.mark.parametrize("kind", ["vmsplice", "splice", "sendfile", "tee"])
async def test_pages_pinned_in_pipes_that_the_memory_budget_cannot_see_are_refused(
    stub: pb.ToolExecutorServiceStub, box: Sandbox, kind: str
) -> None:
    """Under the watcher (these machines have no cgroup v2) nothing may put a reference to a page
    into a pipe: a pipe holds only what was written into it, and that much memory."""
    result = await run(stub, PIN_IN_PIPES.format(kind=kind))
    out = result.output
    assert "held" not in out["stdout"], out
    assert result.is_error and "PermissionError: [Errno 1]" in out["stderr"], out


async def test_pipes_and_file_copies_still_work_without_splicing(stub: pb.ToolExecutorServiceStub) -> None:
    """shutil's copies fall back from sendfile to reads and writes; pipes of any size still carry data."""
    code = """
import fcntl, os, shutil, subprocess, sys
with open("a", "wb") as f:
    f.write(os.urandom(300_000))
shutil.copyfile("a", "b")
r, w = os.pipe()
fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
os.write(w, b"y" * 500_000)
echo = subprocess.run([sys.executable, "-c", "import sys; sys.stdout.write(sys.stdin.read())"],
                      input="z" * 200_000, capture_output=True, text=True, check=True)
print(open("a", "rb").read() == open("b", "rb").read(), len(os.read(r, 1 << 20)), len(echo.stdout))
"""
    result = await run(stub, code)
    assert not result.is_error, result.output
    assert result.output["stdout"] == "True 500000 200000\n"


async def test_a_keeper_killed_from_outside_leaves_nothing_of_its_call(box: Sandbox) -> None:
    """The keeper cannot be killed by the code; were it killed anyway (the OOM killer, an
    operator), its call ends at once and takes all its processes with it."""
    async for stub in _stub(box):
        call = stub.Execute(_request("import subprocess, time\nsubprocess.Popen(['sleep', '1000'])\ntime.sleep(1000)"))
        assert (await call.read()).progress.message == "started"
        await until(lambda: any(children(pid) for pid in code_processes(box)))  # the code and its sleep
        # This call's code is the one with a child (an earlier call's may still be exiting).
        [code] = [pid for pid in code_processes(box) if children(pid)]
        session = os.getsid(code)
        os.kill(parent_of(code), signal.SIGKILL)
        while (update := await call.read()).WhichOneof("update") != "result":
            pass
        result = json.loads(update.result.output)
        assert result["limit"] is None, result
        assert result["error"].startswith("the sandbox could not run the code: the sandbox process ended"), result
        assert [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if in_session(pid, session)] == []


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def in_session(pid: int, session: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and int(fields[3]) == session


def test_the_startup_line_says_how_the_memory_budget_is_held(services: dict[str, Sandbox]) -> None:
    for box in services.values():
        line = next(x for x in box.log.read_text().splitlines() if "sandbox isolation:" in x)
        assert "; memory per call: watcher (" in line or "; memory per call: cgroup v2 (" in line, line


# As pid 1 (a container started without an init).

# A normal user gets a pid namespace inside a user namespace of its own, on the same uid.
AS_PID_1 = ("unshare", "--pid", "--fork", "--mount-proc") if AS_ROOT else (
    "unshare", "--user", "--map-current-user", "--pid", "--fork", "--mount-proc"
)  # fmt: skip


def children(pid: int) -> list[int]:
    found: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            found += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
    return found


def ns_pids(pid: int) -> list[int]:
    """The process's pid in each pid namespace it is in, outermost first."""
    return [int(p) for p in Path(f"/proc/{pid}/status").read_text().split("NSpid:")[1].splitlines()[0].split()]


def zombies_of(pid: int) -> list[int]:
    found = []
    for child in children(pid):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                found.append(child)
    return found


@pytest.fixture(scope="module", params=["namespaces", "fallback"])
def as_pid_1(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """The service as pid 1 of its own pid namespace; `pid` is its pid as seen from here."""
    mode = {"namespaces": "auto", "fallback": "off"}[request.param]
    for box in _start(tmp_path_factory.mktemp("pid1"), f"pid1-{request.param}", AS_PID_1, namespaces=mode):
        [service] = children(box.pid)  # unshare's one child
        yield Sandbox(box.target, service, box.workdir_root, box.log)
        os.kill(service, signal.SIGTERM)  # unshare holds SIGTERM back; the service stops on it


async def test_as_pid_1_calls_stopped_by_a_limit_leave_no_zombies(as_pid_1: Sandbox) -> None:
    assert ns_pids(as_pid_1.pid) == [as_pid_1.pid, 1]
    async for stub in _stub(as_pid_1):
        timed_out = await run(stub, "import subprocess, time\nsubprocess.Popen(['sleep', '1000'])\ntime.sleep(1000)")
        assert timed_out.output["limit"] == "timeout"
        capped = await run(stub, "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)")
        assert capped.output["limit"] == "output"
        burst = [run(stub, "import time\ntime.sleep(1000)") for _ in range(3)]
        assert {r.output["limit"] for r in await asyncio.gather(*burst)} == {"timeout"}
    # The reaper scans once a second; what it leaves for good stays.
    await until(lambda: not zombies_of(as_pid_1.pid), timeout=10)
    assert children(as_pid_1.pid) == []


# Started as root with the service's interpreter out of uid 65534's reach (pyenv under /root).


def sandbox_command(env: dict[str, str]) -> subprocess.Popen[bytes]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ANTWORT_SANDBOX_")}
    environment.update(PYTHONPATH=str(ROOT), **env)
    cli = [sys.executable, "-m", "antwort_grpc.cli", "executor", "sandbox", "--listen", "127.0.0.1:0"]
    return subprocess.Popen(cli, cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def unreachable_for_nobody(path: str) -> bool:
    # Through env: setpriv execs its command with the capabilities it still had.
    probe = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "env", path, "-c", "pass"]
    return subprocess.run(probe, capture_output=True, check=False).returncode != 0


@ROOT_ONLY
async def test_as_root_the_sandbox_runs_code_on_an_interpreter_its_uid_can_execute() -> None:
    assert unreachable_for_nobody(sys.executable)  # the premise: the service's own one is out of reach
    proc = sandbox_command({})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert "serving on" in line
        async with grpc.aio.insecure_channel(line.rsplit(" ", 1)[-1].strip()) as channel:
            result = await run(pb.ToolExecutorServiceStub(channel), "import sys\nprint(sys.executable)")
        assert result.output["stdout"] == "/usr/bin/python3\n"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    assert b"set ANTWORT_SANDBOX_PYTHON to choose another" in err


@ROOT_ONLY
def test_an_interpreter_chosen_explicitly_that_its_uid_cannot_run_is_a_one_line_error() -> None:
    proc = sandbox_command({"ANTWORT_SANDBOX_PYTHON": sys.executable})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and out == b""
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert "cannot run" in lines[0] and "set ANTWORT_SANDBOX_PYTHON" in lines[0]
