"""One memory budget for all the processes of a call, where no cgroup gives one.

RLIMIT_AS bounds each process; a program that forks six children of 300 MB each stays under it
and still takes 1.8 GB. The watcher sums the resident memory of every process of the call's code
(its session, minus the sandbox's own helpers) a few times a second and stops the call when the
sum passes the budget. It is a bound after the fact: between two looks the code can allocate what
its processes' address-space limits allow.

The call's processes are found without help from the code: the service starts each call in a new
session (the child is its leader, sid = its pid), the code cannot leave it (setsid is denied), and
the code runs in a process group of its own beneath the keeper, whose group is the session's.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass

PAGE = os.sysconf("SC_PAGE_SIZE")
POLL_SECONDS = 0.1


@dataclass(frozen=True, slots=True)
class Usage:
    rss_bytes: int
    processes: int


def parse_stat(text: str) -> tuple[int, int, int]:
    """(process group, session, resident pages) of one /proc/<pid>/stat line. The command name
    (field 2) may hold spaces and parentheses: the fields are counted from its closing one."""
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[2]), int(fields[3]), int(fields[21])


def code_usage(session: int, proc: str = "/proc") -> Usage:
    """Resident memory and number of the processes of `session` outside its leader's group (the
    code's, not the sandbox's helpers)."""
    rss = count = 0
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"{proc}/{entry.name}/stat") as f:
                pgrp, sid, pages = parse_stat(f.read())
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
        if sid == session and pgrp != session:
            rss += pages * PAGE
            count += 1
    return Usage(rss, count)


async def watch_memory(session: int, budget: int, over: Callable[[Usage], None]) -> None:
    """Until cancelled: call `over` once when the code's processes together pass `budget` bytes."""
    while True:
        await asyncio.sleep(POLL_SECONDS)
        usage = await asyncio.to_thread(code_usage, session)
        if usage.rss_bytes > budget:
            over(usage)
            return
