"""Reaping orphans when a service runs as pid 1 (a container started without an init).

A process whose parent dies is handed to pid 1, and only pid 1 can collect its exit status; until
then it stays a zombie. The sandbox's own helpers normally reap what they start, but a helper killed
outright (a child that ignored its stop request) leaves its children to pid 1.

Every child that the service waits for itself (asyncio subprocesses, `subprocess.run`) is collected
by its waiter at once, so a zombie that is still there a scan later has no waiter: only those are
reaped, by pid, never with `waitpid(-1)`, which would steal an exit status that asyncio waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator

log = logging.getLogger(__name__)

SCAN_SECONDS = 1.0


def zombie_children() -> set[int]:
    """This process's children (of every thread) that have exited and not been collected."""
    zombies: set[int] = set()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return zombies
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                children = f.read().split()
        except OSError:
            continue
        for child in children:
            try:
                with open(f"/proc/{child}/stat") as f:
                    # "pid (comm) state ...": comm may hold spaces and parentheses.
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state == "Z":
                zombies.add(int(child))
    return zombies


def reap(pids: set[int]) -> int:
    reaped = 0
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            done, _ = os.waitpid(pid, os.WNOHANG)
            reaped += done == pid
    return reaped


async def reap_orphans(interval: float = SCAN_SECONDS) -> None:
    """Until cancelled: every `interval`, reap the zombies that were zombies at the last scan too."""
    seen: set[int] = set()
    while True:
        await asyncio.sleep(interval)
        zombies = await asyncio.to_thread(zombie_children)
        if reaped := reap(zombies & seen):
            log.debug("reaped %d orphaned processes", reaped)
        seen = zombies


@contextlib.asynccontextmanager
async def reaping_if_init() -> AsyncIterator[None]:
    """Reap orphans while the block runs, when this process is pid 1."""
    if os.getpid() != 1:
        yield
        return
    log.info("running as pid 1: reaping orphaned processes")
    task = asyncio.create_task(reap_orphans(), name="orphan-reaper")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
