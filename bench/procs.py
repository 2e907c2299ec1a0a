"""Child processes of a benchmark run (backend, gateway, echo server) and what /proc says about them.

Each child prints one line `READY <port>` once it serves. CPU time is the process's CPU-time clock
(all threads, including threads that already ended, in nanoseconds), memory from VmRSS.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Child:
    name: str
    process: asyncio.subprocess.Process
    port: int

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def cpu_seconds_with_children(self) -> float:
        """cpu_seconds, and that of the processes it started that still run (a worker process)."""
        return cpu_seconds(self.pid) + sum(cpu_seconds(child) for child in children(self.pid))

    def rss_bytes(self) -> int:
        return rss_bytes(self.pid)

    def peak_rss_bytes(self) -> int:
        return rss_bytes(self.pid, "VmHWM")

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 15)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


def cpu_seconds(pid: int) -> float:
    """The process's CPU time, all its threads (also those that ended), to the nanosecond: its
    CPU-time clock, whose id Linux makes as (~pid << 3) | CPUCLOCK_SCHED (what
    clock_getcpuclockid returns, which Python lacks). /proc's utime + stime count 10 ms ticks:
    too coarse for a short block."""
    try:
        return time.clock_gettime((~pid << 3) | 2)
    except OSError:
        return _cpu_ticks(pid)


def children(pid: int) -> list[int]:
    """The processes `pid` started that still run, and theirs."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(child) for child in f.read().split()]
    return found + [grandchild for child in found for grandchild in children(child)]


def _cpu_ticks(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        # The command name (field 2) may hold spaces: count fields after its closing parenthesis.
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """The process's resident memory now (VmRSS), or the most it has had (VmHWM: no sampling
    misses a peak)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for {pid}")


async def spawn(name: str, module: str, *args: str, timeout: float = 30.0) -> Child:
    """Start `python -m module args…` and wait for its READY line."""
    return await spawn_command(name, [sys.executable, "-m", module, *args], timeout=timeout)


async def spawn_command(name: str, command: list[str], timeout: float = 30.0) -> Child:
    """Start `command` (a program that prints READY <port>) and wait for its READY line."""
    module = command[0]
    # The child's stdin is a pipe from us: when we end, however we end, it sees EOF and stops.
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    try:
        async with asyncio.timeout(timeout):
            while True:
                line = (await process.stdout.readline()).decode()
                if not line:
                    raise RuntimeError(f"{name} ({module}) exited before it was ready")
                if line.startswith("READY "):
                    break
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise
    # Keep draining stdout so a chatty child can never block on a full pipe.
    asyncio.get_running_loop().create_task(_drain(process.stdout))
    return Child(name, process, int(line.split()[1]))


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


async def until_stopped() -> None:
    """In a child: returns on SIGTERM, or when the parent is gone (EOF on stdin)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    def stdin_ready() -> None:
        if not os.read(0, 4096):
            loop.remove_reader(0)
            stop.set()

    loop.add_reader(0, stdin_ready)
    await stop.wait()


def machine() -> str:
    """Cores, CPU model, memory, Python and kernel: what the RESULTS table calls the machine."""
    model = "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    python = ".".join(map(str, sys.version_info[:3]))
    return f"{os.cpu_count()} cores {model}, {memory:.0f} GiB, Python {python}, Linux {os.uname().release}"


def load_average() -> float:
    return os.getloadavg()[0]
