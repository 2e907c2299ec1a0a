"""One memory budget for all the processes of a call, where no cgroup gives one.

RLIMIT_AS bounds each process; a program that forks six children of 300 MB each stays under it
and still takes 1.8 GB. The watcher sums the resident and swapped-out memory of every process of
the call's code (its session, minus the sandbox's own helpers) a few times a second and stops the
call when the sum passes the budget. It is a bound after the fact: between two looks the code can
allocate what its processes' address-space limits allow. Shared memory is counted where it is
resident, and can hold pages resident nowhere, and so can a pipe that a page was spliced into: the
seccomp filter refuses to create either (memfds, shared anonymous mappings, System V segments;
vmsplice, splice, tee, sendfile) where this watcher holds the budget (seccomp.py).

The call's processes are those of its session (session.py); the code runs in a process group of
its own beneath the keeper, whose group is the session's (the sandbox's helpers).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass

from antwort_grpc.tool_services.sandbox.session import processes

PAGE = os.sysconf("SC_PAGE_SIZE")
POLL_SECONDS = 0.1


@dataclass(frozen=True, slots=True)
class Usage:
    bytes: int  # resident and swapped out
    processes: int


def code_usage(session: int, proc: str = "/proc") -> Usage:
    """Memory and number of the processes of `session` outside its leader's group (the code's,
    not the sandbox's helpers)."""
    used = count = 0
    for pid, stat in processes(session, proc):
        if stat.pgrp != session:
            used += stat.pages * PAGE + _swapped(pid, proc)
            count += 1
    return Usage(used, count)


def _swapped(pid: int, proc: str) -> int:
    """Bytes of the process in swap (MADV_PAGEOUT can move them there at will)."""
    try:
        with open(f"{proc}/{pid}/status") as f:
            for line in f:
                if line.startswith("VmSwap:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


async def watch_memory(session: int, budget: int, over: Callable[[Usage], None]) -> None:
    """Until cancelled: call `over` once when the code's processes together pass `budget` bytes."""
    while True:
        await asyncio.sleep(POLL_SECONDS)
        usage = await asyncio.to_thread(code_usage, session)
        if usage.bytes > budget:
            over(usage)
            return
