"""What this process may use of the machine: CPU cores and memory, as its cgroup (a container's
limits) or the machine itself allows. The defaults of the gateway's admission are sized by them."""

from __future__ import annotations

import math
import os
from pathlib import Path

_CGROUP = Path("/sys/fs/cgroup")
# The processes that divide the machine between them: a worker of `serve --workers N` is told N.
_sharing = 1


def share(processes: int) -> None:
    """This process is one of `processes` that share the machine evenly (workers serving the same
    ports): the figures below are its share from now on."""
    global _sharing
    _sharing = max(1, processes)


def machine_cores() -> float:
    """Cores the processes of this cgroup may use: the CPU affinity, lowered by a cgroup CPU quota."""
    cores = float(len(os.sched_getaffinity(0)))
    quota = _cgroup_cpu_quota()
    return max(1.0, min(cores, quota)) if quota else max(1.0, cores)


def cpu_cores() -> float:
    """Cores this process may use: the machine's (`machine_cores`), or its share of them."""
    return machine_cores() / _sharing


def memory_bytes() -> int:
    """Memory this process may use: the cgroup's limit when there is one, else the machine's; or
    its share of that."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = _cgroup_memory_limit()
    return (min(physical, limit) if limit else physical) // _sharing


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _cgroup_cpu_quota() -> float:
    # cgroup v2: "max 100000" or "200000 100000"; v1: quota and period apart (-1: none).
    parts = _read(_CGROUP / "cpu.max").split()
    if len(parts) == 2 and parts[0] != "max":
        return int(parts[0]) / int(parts[1])
    quota, period = _read(_CGROUP / "cpu" / "cpu.cfs_quota_us"), _read(_CGROUP / "cpu" / "cpu.cfs_period_us")
    if quota.lstrip("-").isdigit() and int(quota) > 0 and period.isdigit():
        return int(quota) / int(period)
    return 0.0


def _cgroup_memory_limit() -> int:
    for path in (_CGROUP / "memory.max", _CGROUP / "memory" / "memory.limit_in_bytes"):
        value = _read(path)
        # v1 says "no limit" with a huge number.
        if value.isdigit() and int(value) < 1 << 60:
            return int(value)
    return 0


def per_core(count: int) -> int:
    """`count` for every core this process may use."""
    return math.ceil(count * cpu_cores())
