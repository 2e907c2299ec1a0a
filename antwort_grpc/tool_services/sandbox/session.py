"""The processes of one call, found without help from the code: the service starts each call in a
new session (the child is its leader, sid = its pid), and the code can leave it neither by setsid
nor by dying keepers (an orphan keeps its session). The memory watcher sums them (budget.py); at
the end of a call every one that is left is killed, whoever its parent is by then.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

# At most this many rounds of killing what is left: a process may fork between the scan that
# finds it and its SIGKILL; its child is in the session too, and found by the next round.
END_ROUNDS = 50
ROUND_PAUSE_SECONDS = 0.01


class Stat(NamedTuple):
    state: str
    pgrp: int
    session: int
    pages: int  # resident


def parse_stat(text: str) -> Stat:
    """One /proc/<pid>/stat line. The command name (field 2) may hold spaces and parentheses: the
    fields are counted from its closing one."""
    fields = text.rsplit(")", 1)[1].split()
    return Stat(fields[0], int(fields[2]), int(fields[3]), int(fields[21]))


def read_stat(pid: int | str, proc: str = "/proc") -> Stat | None:
    try:
        with open(f"{proc}/{pid}/stat") as f:
            return parse_stat(f.read())
    except (OSError, ValueError, IndexError):
        return None  # ended meanwhile


def processes(session: int, proc: str = "/proc") -> Iterator[tuple[int, Stat]]:
    """(pid, stat) of every live process of `session` (zombies hold no memory and run nothing)."""
    for entry in os.scandir(proc):
        if entry.name.isdigit():
            stat = read_stat(entry.name, proc)
            if stat is not None and stat.session == session and stat.state != "Z":
                yield int(entry.name), stat


def end_session(session: int) -> int:
    """SIGKILL every process left in `session`, round after round until none is; how many there
    were. Each through a pidfd opened before its session is checked, so that a pid reused
    meanwhile by another process is never hit."""
    killed: set[int] = set()
    for _ in range(END_ROUNDS):
        left = [pid for pid, _ in processes(session)]
        if not left:
            break
        killed.update(pid for pid in left if _kill_member(pid, session))
        time.sleep(ROUND_PAUSE_SECONDS)
    return len(killed)


def _kill_member(pid: int, session: int) -> bool:
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:  # no pidfd_open (kernel before 5.3, or a seccomp profile without it)
        return _kill_if_in(session, pid, lambda: os.kill(pid, signal.SIGKILL))
    try:
        return _kill_if_in(session, pid, lambda: signal.pidfd_send_signal(pidfd, signal.SIGKILL))
    finally:
        os.close(pidfd)


def _kill_if_in(session: int, pid: int, kill: Callable[[], None]) -> bool:
    """`kill` `pid` if it is still a member of `session` (its end is not waited for); whether it was."""
    stat = read_stat(pid)
    if stat is None or stat.session != session:
        return False
    with contextlib.suppress(OSError):
        kill()
    return True
