"""The seccomp filter of the code's processes: a classic BPF program that the service builds and the
child (child.py) installs right before it execs the code's interpreter, the same on every kernel.

Signals are the part a filter alone cannot bound: `kill(pid)` names a process by a number, and in
the fallback every process of the uid (the service's threads, another call's keeper and code) is
a valid target. So the filter lets a signal through by itself only when it cannot leave the code's
own process group (pid 0, the group, its leader), refuses one aimed at any other group or at every
process (-1), and hands one aimed at any other pid to the keeper as a seccomp user notification:
the keeper sends it only to a member of the code's group (child.py). Where the kernel has no user
notification (before 5.0) the program is built with `notify=False` and refuses those too. The
code cannot take the keeper's place with a filter of its own: the kernel allows one listener per
chain of filters (EBUSY), and without one the most restrictive answer of all filters wins.
Other ways to make the kernel signal a process (F_SETOWN, F_SETSIG, F_SETOWN_EX, FIOSETOWN,
SIOCSPGRP; pidfds; tkill) are refused outright.

The code's process group is known only in the child, after it forked the code: the program holds
the placeholders GROUP and NEG_GROUP, which `resolve` (and the child) replace.
"""

from __future__ import annotations

import errno
import functools
from dataclasses import dataclass

# Placeholders for the code's process group (the pid of its first process), and minus that.
GROUP, NEG_GROUP = "group", "-group"

Instruction = tuple[int, int, int, int | str]

BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_RET_K, BPF_AND_K = 0x20, 0x15, 0x35, 0x06, 0x54
RET_KILL_PROCESS, RET_ALLOW, RET_ERRNO, RET_USER_NOTIF = 0x80000000, 0x7FFF0000, 0x00050000, 0x7FC00000
X32_SYSCALL_BIT = 0x40000000
SECCOMP_ARGS = 16  # offsetof(struct seccomp_data, args[0]); each argument is 8 bytes, low word first
NEGATIVE = 0x80000000  # a pid_t (the low word) at or above this is negative: a group, or -1
SOCK_STREAM, SOCK_TYPE_MASK = 1, 0xF
PRIO_PROCESS, IOPRIO_WHO_PROCESS = 0, 1
F_SETOWN, F_SETSIG, F_SETOWN_EX = 8, 10, 15
FIOSETOWN, SIOCSPGRP = 0x8901, 0x8902
MAP_SHARED, MAP_SHARED_VALIDATE, MAP_ANONYMOUS = 0x01, 0x03, 0x20

EPERM, EACCES = errno.EPERM, errno.EACCES

# The syscalls the filter names: their numbers on each machine of MACHINES, in that order.
MACHINES = ("x86_64", "aarch64")
NUMBERS: dict[str, tuple[int, int]] = {
    "socket": (41, 198), "connect": (42, 203), "bind": (49, 200), "sendto": (44, 206), "socketpair": (53, 199),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "setsid": (112, 157), "setpgid": (109, 154), "tkill": (200, 130), "pidfd_send_signal": (424, 424),
    "pidfd_open": (434, 434), "kill": (62, 129), "tgkill": (234, 131), "rt_sigqueueinfo": (129, 138),
    "rt_tgsigqueueinfo": (297, 240),
    "fcntl": (72, 25), "ioctl": (16, 29), "mmap": (9, 222),
    "prlimit64": (302, 261), "setpriority": (141, 140), "ioprio_set": (251, 30), "sched_setaffinity": (203, 122),
    "sched_setscheduler": (144, 119), "sched_setparam": (142, 118), "sched_setattr": (314, 274),
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "pidfd_getfd": (438, 438),
    "kcmp": (312, 272), "perf_event_open": (298, 241), "migrate_pages": (256, 238), "move_pages": (279, 239),
    "process_madvise": (440, 440), "process_mrelease": (448, 448),
    "memfd_create": (319, 279), "memfd_secret": (447, 447),
    "shmget": (29, 194), "shmat": (30, 196), "shmctl": (31, 195), "shmdt": (67, 197), "semget": (64, 190),
    "semop": (65, 193), "semctl": (66, 191), "semtimedop": (220, 192), "msgget": (68, 186), "msgsnd": (69, 189),
    "msgrcv": (70, 188), "msgctl": (71, 187), "mq_open": (240, 180), "mq_unlink": (241, 181),
    "seccomp": (317, 277), "vmsplice": (278, 75), "splice": (275, 76), "tee": (276, 77), "sendfile": (40, 71),
}  # fmt: skip
SYSCALLS = {machine: {name: numbers[i] for name, numbers in NUMBERS.items()} for i, machine in enumerate(MACHINES)}

# Denied outright -> errno. socket(2) is the network (every family: a Unix socket path can reach a
# host daemon), and connect/bind have nothing legitimate to work on without it; io_uring can open
# sockets without socket(2); setsid/setpgid would let a process leave the group that is killed;
# tkill and pidfds reach processes by a number this filter cannot check. Then what reads, writes or
# steers another process's memory (in the fallback the code has the service's uid, and every
# call's code shares one uid). System V IPC and POSIX message queues: objects that outlive the
# call in the fallback (one IPC namespace for the host), reach the host's, and hold memory that
# no process's resident memory shows.
DENIED: dict[str, int] = {
    "socket": EACCES, "connect": EACCES, "bind": EACCES,
    "io_uring_setup": EPERM, "io_uring_enter": EPERM, "io_uring_register": EPERM,
    "setsid": EPERM, "setpgid": EPERM, "tkill": EPERM, "pidfd_send_signal": EPERM, "pidfd_open": EPERM,
    "ptrace": EPERM, "process_vm_readv": EPERM, "process_vm_writev": EPERM, "pidfd_getfd": EPERM,
    "kcmp": EPERM, "perf_event_open": EPERM, "migrate_pages": EPERM, "move_pages": EPERM,
    "process_madvise": EPERM, "process_mrelease": EPERM,
    "shmget": EPERM, "shmat": EPERM, "shmctl": EPERM, "shmdt": EPERM, "semget": EPERM, "semop": EPERM,
    "semctl": EPERM, "semtimedop": EPERM, "msgget": EPERM, "msgsnd": EPERM, "msgrcv": EPERM, "msgctl": EPERM,
    "mq_open": EPERM, "mq_unlink": EPERM,
}  # fmt: skip

# Memory that outlives its pages' residence in any process. Shared memory (shmem): a memfd's
# without being mapped, a shared anonymous mapping's after MADV_DONTNEED, or in a forked child that
# never touched it. Pages referenced from a pipe: vmsplice puts a reference to the caller's own
# page into a pipe slot, and the page stays when it is unmapped, a whole transparent huge page
# (2 MiB) for one byte of it; splice and sendfile into a pipe do the same with a file's page cache
# (a large folio on xfs or a huge tmpfs; sendfile into a socket pair as well), and tee copies such
# references to more pipes. Without them a pipe holds only pages that write(2) filled, its own size
# at most. Where the call's budget is the watcher's, which sums resident memory, the filter refuses
# all of these; a per-call cgroup charges the pages to the call, and then they are allowed.
# Nothing common needs them: shutil's copies fall back from sendfile to reads and writes.
UNCOUNTED_MEMORY: dict[str, int] = {
    "memfd_create": EPERM, "memfd_secret": EPERM,
    "vmsplice": EPERM, "splice": EPERM, "tee": EPERM, "sendfile": EPERM,
}  # fmt: skip
# mmap(..., flags, ...): MAP_SHARED (or MAP_SHARED_VALIDATE) with MAP_ANONYMOUS.
SHARED_ANONYMOUS = (
    "mmap",
    3,
    MAP_SHARED_VALIDATE | MAP_ANONYMOUS,
    (MAP_SHARED | MAP_ANONYMOUS, MAP_SHARED_VALIDATE | MAP_ANONYMOUS),
)


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

# (syscall, argument, mask, values): refused with EPERM when the argument's low word, masked, is
# one of the values. These: the commands that make the kernel signal a process of the caller's
# choosing when a descriptor becomes ready.
REFUSED_FORMS: tuple[tuple[str, int, int, tuple[int, ...]], ...] = (
    ("fcntl", 1, 0xFFFFFFFF, (F_SETOWN, F_SETSIG, F_SETOWN_EX)),
    ("ioctl", 1, 0xFFFFFFFF, (FIOSETOWN, SIOCSPGRP)),
)

# Signalling syscalls whose first argument is a process (kill: or 0, -group, -1; the others: the
# thread group). What the filter cannot decide goes to the keeper (or is refused without it).
SIGNALLING = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")


# What the child needs the numbers of: installing the filter, and the keeper's side of signals.
CHILD_SYSCALLS = ("seccomp", *SIGNALLING, "pidfd_open", "pidfd_send_signal")


@dataclass(frozen=True)
class Arch:
    audit: int
    numbers: dict[str, int]


ARCHES: dict[str, Arch] = {
    "x86_64": Arch(0xC000003E, SYSCALLS["x86_64"]),
    "aarch64": Arch(0xC00000B7, SYSCALLS["aarch64"]),
}


def program(machine: str, *, notify: bool = True, count_all_memory: bool = False) -> list[Instruction]:
    """The filter for `machine`: another architecture's syscalls kill, denied ones return an errno,
    conditional ones return theirs unless their arguments have the allowed form, signals as the
    module says. `notify`: signals to other pids go to the keeper (else refused);
    `count_all_memory`: the budget sees memory held by descriptors (a per-call cgroup), so memfds
    and splicing into pipes are allowed."""
    if machine not in ARCHES:
        raise OSError(errno.ENOSYS, f"no seccomp filter for {machine}")
    arch = ARCHES[machine]
    prog: list[Instruction] = [
        (BPF_LD_W_ABS, 0, 0, 4),
        (BPF_JEQ_K, 1, 0, arch.audit),
        (BPF_RET_K, 0, 0, RET_KILL_PROCESS),
        (BPF_LD_W_ABS, 0, 0, 0),
    ]
    if machine == "x86_64":  # the x32 ABI reaches the same syscalls under other numbers
        prog += [(BPF_JGE_K, 0, 1, X32_SYSCALL_BIT), (BPF_RET_K, 0, 0, RET_ERRNO | errno.ENOSYS)]
    denied = DENIED if count_all_memory else {**DENIED, **UNCOUNTED_MEMORY}
    for name, err in denied.items():
        prog += [(BPF_JEQ_K, 0, 1, arch.numbers[name]), (BPF_RET_K, 0, 0, RET_ERRNO | err)]
    # Each block below loads an argument over the syscall number, so it ends in a return; a
    # syscall that differs jumps past the block.
    for name, (err, args) in CONDITIONAL.items():
        prog += _block(arch.numbers[name], _conditional(err, args))
    for name, index, mask, values in REFUSED_FORMS if count_all_memory else (*REFUSED_FORMS, SHARED_ANONYMOUS):
        body: list[Instruction] = [_load(index)]
        if mask != 0xFFFFFFFF:
            body.append((BPF_AND_K, 0, 0, mask))
        for value in values:
            body += [(BPF_JEQ_K, 0, 1, value), (BPF_RET_K, 0, 0, RET_ERRNO | EPERM)]
        prog += _block(arch.numbers[name], [*body, (BPF_RET_K, 0, 0, RET_ALLOW)])
    beyond = RET_USER_NOTIF if notify else RET_ERRNO | EPERM
    for name in SIGNALLING:
        prog += _block(arch.numbers[name], _signal_rules(name, beyond))
    prog.append((BPF_RET_K, 0, 0, RET_ALLOW))
    return prog


@functools.cache
def child_config(machine: str, *, count_all_memory: bool, notify: bool = True) -> dict[str, object]:
    """What the child installs: the program (signals to other pids through the keeper), the one
    for a kernel without user notification, and the syscall numbers it needs."""
    without_keeper = program(machine, notify=False, count_all_memory=count_all_memory)
    return {
        "program": program(machine, count_all_memory=count_all_memory) if notify else None,
        "without_keeper": without_keeper,
        "syscalls": {name: ARCHES[machine].numbers[name] for name in CHILD_SYSCALLS},
    }


def resolve(prog: list[Instruction], group: int) -> list[tuple[int, int, int, int]]:
    """The program with the code's process group filled in (child.py does the same)."""
    values = {GROUP: group & 0xFFFFFFFF, NEG_GROUP: -group & 0xFFFFFFFF}
    return [(code, jt, jf, values[k] if isinstance(k, str) else k) for code, jt, jf, k in prog]


def _signal_rules(name: str, beyond: int) -> list[Instruction]:
    """The code's own process group is always allowed: for kill pid 0, the group's leader and
    -group; for the others the leader's process. Any other negative pid of kill (another group, or
    -1: every process) is refused; any other pid gets `beyond`."""
    own: tuple[int | str, ...] = (0, GROUP, NEG_GROUP) if name == "kill" else (GROUP,)
    negative = [(BPF_JGE_K, 2, 0, NEGATIVE)] if name == "kill" else []
    body: list[Instruction] = [_load(0)]
    for i, pid in enumerate(own):  # each jumps to the allow below
        body.append((BPF_JEQ_K, len(own) - i + len(negative), 0, pid))
    returns = [(BPF_RET_K, 0, 0, beyond), (BPF_RET_K, 0, 0, RET_ALLOW), (BPF_RET_K, 0, 0, RET_ERRNO | EPERM)]
    return [*body, *negative, *returns]


def _load(index: int, high: bool = False) -> Instruction:
    return (BPF_LD_W_ABS, 0, 0, SECCOMP_ARGS + 8 * index + (4 if high else 0))


def _block(nr: int, body: list[Instruction]) -> list[Instruction]:
    """`body` for syscall `nr` only: any other jumps past it."""
    return [(BPF_JEQ_K, 0, len(body), nr), *body]


def _conditional(err: int, args: tuple[Arg, ...]) -> list[Instruction]:
    checks: list[list[Instruction]] = []
    for arg in args:
        check = [_load(arg.index, arg.high)]
        if arg.mask != 0xFFFFFFFF:
            check.append((BPF_AND_K, 0, 0, arg.mask))
        checks.append(check)
    body: list[Instruction] = []
    for i, check in enumerate(checks):
        # A mismatch jumps to the denial: past the later checks (each ends in a JEQ) and the allow.
        later = sum(len(c) + 1 for c in checks[i + 1 :])
        body += [*check, (BPF_JEQ_K, 0, later + 1, args[i].value)]
    return [*body, (BPF_RET_K, 0, 0, RET_ALLOW), (BPF_RET_K, 0, 0, RET_ERRNO | err)]
