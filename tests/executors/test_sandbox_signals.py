"""Signals in the sandbox's fallback (no namespaces, as the shipped deploy runs it under seccomp
RuntimeDefault), on this kernel and on older ones, simulated with the test-only switches: Landlock
capped at each older ABI (before 6 none scopes signals; 0 is no Landlock), and a kernel without
seccomp user notification (before 5.0). The service runs as root (the code on uid 65534, shared by
every call) and on a normal uid (the code on the service's own uid). On each, a call's code tries
every way to signal the service, one of its threads, another call's keeper and code: all are
refused, and nothing of the victim stops. The code still signals its own processes.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from antwort_grpc import pb
from antwort_grpc.tool_services.sandbox.isolation import (
    TEST_ONLY_LANDLOCK_ABI_CAP,
    TEST_ONLY_NO_SECCOMP_NOTIFY,
    landlock_abi,
)
from tests.executors.test_sandbox import Sandbox, _request, _start, _stub, run
from tests.executors.test_sandbox_hardening import AS_ROOT, AS_SAME_UID, code_processes, threads, until

# This kernel's Landlock ABI and every older one, down to 0 (no Landlock: before 5.13, or not enabled).
ABIS = list(range(landlock_abi(), -1, -1))
UIDS = ["root", "same-uid"] if AS_ROOT else ["same-uid"]


def _service(tmp: Path, uid: str, abi: int, *, notify: bool = True) -> Iterator[Sandbox]:
    switches = {TEST_ONLY_LANDLOCK_ABI_CAP: str(abi)}
    if not notify:
        switches[TEST_ONLY_NO_SECCOMP_NOTIFY] = "1"
    saved = {name: os.environ.get(name) for name in switches}
    os.environ.update(switches)  # _start hands its own environment to the service
    try:
        wrapper = AS_SAME_UID if uid == "same-uid" else ()
        # On another uid than the tests' own, the process limit counts that uid only.
        limit = {"max_processes": "64"} if uid == "same-uid" and AS_ROOT else {}
        name = f"{uid}-abi{abi}{'' if notify else '-no-notify'}"
        yield from _start(tmp, name, wrapper, namespaces="off", timeout_seconds="30", **limit)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module", params=[(uid, abi) for uid in UIDS for abi in ABIS], ids=lambda p: f"{p[0]}-abi{p[1]}")
def box(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    uid, abi = request.param
    yield from _service(tmp_path_factory.mktemp("older"), uid, abi)


@pytest.fixture(scope="module", params=UIDS)
def without_notify(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """A kernel before 5.0 with Landlock's ABI 5 of a newer one: the filter alone decides."""
    yield from _service(tmp_path_factory.mktemp("older"), request.param, 5, notify=False)


@pytest.fixture
async def stub(box: Sandbox) -> AsyncIterator[pb.ToolExecutorServiceStub]:
    async for s in _stub(box):
        yield s


def alive(pid: int) -> bool:
    """Running (a zombie is dead: its parent just has not collected it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


ATTACK = """
import ctypes, fcntl, json, os, signal, socket
libc = ctypes.CDLL(None, use_errno=True)
NR = {{"x86_64": dict(tgkill=234, rt_sigqueueinfo=129, pidfd_open=434, tkill=200),
       "aarch64": dict(tgkill=131, rt_sigqueueinfo=138, pidfd_open=434, tkill=130)}}[os.uname().machine]
F_SETSIG, F_SETOWN_EX, FIOSETOWN = 10, 15, 0x8901
results = []

def attempt(what, action):
    try:
        if action() == -1:
            raise OSError(ctypes.get_errno(), "")
        results.append([what, "done"])
    except OSError as err:
        results.append([what, os.strerror(err.errno) if err.errno else str(err)])

def sigio(fd_owner, how):
    r, w = os.pipe()
    how(r, fd_owner)
    fcntl.fcntl(r, F_SETSIG, signal.SIGKILL)
    fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_ASYNC)
    os.write(w, b"x")  # SIGIO, as SIGKILL, to the owner

def owner_ex(fd, pid):
    fcntl.fcntl(fd, F_SETOWN_EX, bytes((ctypes.c_int32 * 2)(0, pid)))  # F_OWNER_TID

info = (ctypes.c_int32 * 32)(signal.SIGKILL, 0, -1)  # si_code SI_QUEUE
for label, pid in {targets}.items():
    attempt(f"kill({{label}}, 0)", lambda: os.kill(pid, 0))
    attempt(f"kill({{label}}, SIGKILL)", lambda: os.kill(pid, signal.SIGKILL))
    attempt(f"tkill({{label}})", lambda: libc.syscall(NR["tkill"], pid, signal.SIGKILL))
    attempt(f"rt_sigqueueinfo({{label}})", lambda: libc.syscall(NR["rt_sigqueueinfo"], pid, signal.SIGKILL, info))
    attempt(f"pidfd_open({{label}})", lambda: libc.syscall(NR["pidfd_open"], pid, 0))
    attempt(f"F_SETOWN({{label}})", lambda: sigio(pid, lambda fd, p: fcntl.fcntl(fd, fcntl.F_SETOWN, p)))
    attempt(f"F_SETOWN_EX({{label}})", lambda: sigio(pid, owner_ex))
    attempt(f"FIOSETOWN({{label}})", lambda: fcntl.ioctl(socket.socketpair()[0], FIOSETOWN, bytes(ctypes.c_int32(pid))))
for tid in {service_threads}:
    attempt(f"tgkill(service, {{tid}})", lambda: libc.syscall(NR["tgkill"], {service}, tid, signal.SIGKILL))
for label, pgid in {groups}.items():
    attempt(f"killpg({{label}})", lambda: os.killpg(pgid, signal.SIGKILL))
attempt("kill(-1, 0)", lambda: os.kill(-1, 0))  # every process (a probe: nothing is sent)
print(json.dumps(results))
"""


async def attack_the_service_and_another_call(stub: pb.ToolExecutorServiceStub, box: Sandbox) -> dict[str, str]:
    """Start a victim call, attack it and the service from a second call; the victim is then still
    running, untouched, and the service still serves. The attempts' outcomes."""
    victim = stub.Execute(_request("import time\ntime.sleep(1000)", call_id="victim"))
    assert (await victim.read()).progress.message == "started"
    await until(lambda: code_processes(box))
    [victim_code] = code_processes(box)
    keeper = parent(victim_code)
    service_threads = threads(box.pid)
    targets = {"service": box.pid, "a service thread": service_threads[-1], "keeper": keeper, "victim": victim_code}
    groups = {"service": os.getpgid(box.pid), "keeper": os.getpgid(keeper), "victim": os.getpgid(victim_code)}
    code = ATTACK.format(targets=targets, groups=groups, service=box.pid, service_threads=service_threads)

    attack = await run(stub, code)

    assert attack.output["stdout"], attack.output["stderr"][-1500:]
    outcomes = dict(json.loads(attack.output["stdout"].splitlines()[-1]))
    assert alive(box.pid) and alive(keeper) and alive(victim_code)
    assert code_processes(box) == [victim_code]
    victim.cancel()
    await until(lambda: not alive(victim_code))
    after = await run(stub, "print(6 * 7)")
    assert after.output["stdout"] == "42\n"
    return outcomes


async def test_code_cannot_signal_the_service_its_threads_or_another_calls_keeper_and_code(
    stub: pb.ToolExecutorServiceStub, box: Sandbox
) -> None:
    abi = int(box.log.stem.rsplit("abi", 1)[1])
    assert (f"filesystem: landlock v{abi};" if abi else "filesystem: no landlock;") in box.log.read_text()
    outcomes = await attack_the_service_and_another_call(stub, box)
    assert outcomes and all(v in ("Operation not permitted", "No such process") for v in outcomes.values()), outcomes
    # The signals the filter decides alone, and those the keeper refuses, say EPERM.
    assert outcomes["kill(keeper, SIGKILL)"] == outcomes["F_SETOWN(service)"] == "Operation not permitted"


# The code's own filter with a listener, and an answer that lets the kill run (FLAG_CONTINUE): the
# kernel gives a notification to the newest of several filters that ask for one.
OWN_FILTER = """
import ctypes, os, signal, threading
libc = ctypes.CDLL(None, use_errno=True)
class Ins(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Ins))]
class Note(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("pid", ctypes.c_uint32), ("flags", ctypes.c_uint32), ("nr", ctypes.c_int32),
                ("arch", ctypes.c_uint32), ("ip", ctypes.c_uint64), ("args", ctypes.c_uint64 * 6)]
class Answer(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint64), ("val", ctypes.c_int64), ("error", ctypes.c_int32), ("flags", ctypes.c_uint32)]
KILL, SECCOMP = {{"x86_64": (62, 317), "aarch64": (129, 277)}}[os.uname().machine]
# kill -> user notification, everything else allowed
program = (Ins * 4)(Ins(0x20, 0, 0, 0), Ins(0x15, 0, 1, KILL), Ins(0x06, 0, 0, 0x7FC00000), Ins(0x06, 0, 0, 0x7FFF0000))
listener = libc.syscall(SECCOMP, 1, 8, ctypes.byref(Prog(4, program)))  # SECCOMP_FILTER_FLAG_NEW_LISTENER
print("own listener:", os.strerror(ctypes.get_errno()) if listener < 0 else "installed", flush=True)

def let_through():
    note = Note()
    if libc.ioctl(listener, ctypes.c_ulong(0xC0502100), ctypes.byref(note)) == 0:
        libc.ioctl(listener, ctypes.c_ulong(0xC0182101), ctypes.byref(Answer(note.id, 0, 0, 1)))

if listener >= 0:
    threading.Thread(target=let_through, daemon=True).start()
try:
    os.kill({keeper}, signal.SIGKILL)
    print("kill: done")
except OSError as err:
    print("kill:", err.strerror)
"""


async def own_filter_attack(stub: pb.ToolExecutorServiceStub, box: Sandbox) -> str:
    """A victim call's keeper, attacked through a filter of the attacker's own; the attack's output."""
    victim = stub.Execute(_request("import time\ntime.sleep(1000)", call_id="victim"))
    assert (await victim.read()).progress.message == "started"
    await until(lambda: code_processes(box))
    [victim_code] = code_processes(box)
    keeper = parent(victim_code)
    attack = await run(stub, OWN_FILTER.format(keeper=keeper))
    assert alive(keeper) and alive(victim_code), attack.output
    victim.cancel()
    await until(lambda: not alive(victim_code))
    return str(attack.output["stdout"])


async def test_a_seccomp_filter_of_the_codes_own_cannot_let_a_signal_through(
    stub: pb.ToolExecutorServiceStub, box: Sandbox
) -> None:
    """The kernel allows one listener per chain of filters: the keeper's."""
    assert (
        await own_filter_attack(stub, box) == "own listener: Device or resource busy\nkill: Operation not permitted\n"
    )


async def test_without_the_keeper_a_filter_of_the_codes_own_cannot_let_a_signal_through(
    without_notify: Sandbox,
) -> None:
    """Its listener installs, but the service's filter refuses the kill, and the most restrictive
    answer of all filters wins."""
    async for stub in _stub(without_notify):
        output = await own_filter_attack(stub, without_notify)
    assert output == "own listener: installed\nkill: Operation not permitted\n"


OWN_PROCESSES = """
import json, os, signal, subprocess, time
import multiprocessing as mp
results = {}
try:
    subprocess.run(["sleep", "30"], timeout=0.2)
except subprocess.TimeoutExpired:
    results["subprocess killed at its timeout"] = True
p = mp.get_context("fork").Process(target=time.sleep, args=(30,))
p.start()
p.terminate()
p.join()
results["Process.terminate"] = p.exitcode
child = os.fork()
if child == 0:
    os.kill(os.getpid(), 0)
    os.abort()  # raise(): tgkill of its own thread
results["abort in a child"] = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
child = os.fork()
if child == 0:
    os.kill(os.getpid(), signal.SIGTERM)  # kill() of itself
results["kill itself in a child"] = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
got = []
signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
os.killpg(os.getpgid(0), signal.SIGUSR1)
os.kill(0, signal.SIGUSR1)
os.kill(os.getpid(), signal.SIGUSR1)
signal.pthread_kill(__import__("threading").get_ident(), signal.SIGUSR1)
results["own group and self"] = len(got)
print(json.dumps(results))
"""


async def test_code_still_signals_its_own_processes(stub: pb.ToolExecutorServiceStub) -> None:
    result = await run(stub, OWN_PROCESSES)
    assert not result.is_error, result.output
    assert json.loads(result.output["stdout"]) == {
        "subprocess killed at its timeout": True,
        "Process.terminate": -signal.SIGTERM,
        "abort in a child": -signal.SIGABRT,
        "kill itself in a child": -signal.SIGTERM,
        "own group and self": 4,
    }


async def test_without_seccomp_user_notification_only_the_own_group_can_be_signalled(without_notify: Sandbox) -> None:
    line = next(x for x in without_notify.log.read_text().splitlines() if "sandbox isolation:" in x)
    assert "signals: its own process group only" in line
    async for stub in _stub(without_notify):
        outcomes = await attack_the_service_and_another_call(stub, without_notify)
        assert outcomes and set(outcomes.values()) == {"Operation not permitted"}, outcomes
        code = "import os, signal\nchild = os.fork()\nif child == 0:\n    os.read(os.pipe()[0], 1)\n"
        code += "try:\n    os.kill(child, signal.SIGKILL)\nexcept PermissionError:\n    print('refused', flush=True)\n"
        code += "os.killpg(0, signal.SIGKILL)\n"  # the own group: the child and the code itself
        own = await run(stub, code)
        assert (own.output["stdout"], own.output["signal"]) == ("refused\n", "SIGKILL"), own.output
