"""The resource limits of one run, and reading a child's output without ever holding more than a cap."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from antwort_grpc.tool_services.sandbox.settings import SandboxSettings

MIB = 1024 * 1024
CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    timeout_seconds: float
    cpu_seconds: int
    memory_bytes: int
    processes: int
    file_size_bytes: int
    open_files: int
    output_bytes: int

    @classmethod
    def from_settings(cls, s: SandboxSettings) -> Limits:
        return cls(
            timeout_seconds=s.timeout_seconds,
            cpu_seconds=s.cpu_seconds,
            memory_bytes=s.memory_mb * MIB,
            processes=s.max_processes,
            file_size_bytes=s.max_file_size_mb * MIB,
            open_files=s.max_open_files,
            output_bytes=s.max_output_bytes,
        )

    def rlimits(self) -> list[tuple[str, int, int]]:
        """(resource name, soft, hard) for setrlimit in the child. Soft CPU sends SIGXCPU, the hard
        one a second later SIGKILL; no core files (they would land in the work directory)."""
        return [
            ("RLIMIT_CPU", self.cpu_seconds, self.cpu_seconds + 1),
            ("RLIMIT_AS", self.memory_bytes, self.memory_bytes),
            ("RLIMIT_NPROC", self.processes, self.processes),
            ("RLIMIT_FSIZE", self.file_size_bytes, self.file_size_bytes),
            ("RLIMIT_NOFILE", self.open_files, self.open_files),
            ("RLIMIT_CORE", 0, 0),
        ]


@dataclass(slots=True)
class Captured:
    data: bytes
    truncated: bool

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


async def read_capped(stream: asyncio.StreamReader, cap: int, on_overflow: Callable[[], None]) -> Captured:
    """Keep the first `cap` bytes; past them call `on_overflow` once (the caller stops the code) and
    discard the rest until the stream ends."""
    kept = bytearray()
    truncated = False
    while chunk := await stream.read(CHUNK):
        if truncated:
            continue
        room = cap - len(kept)
        kept += chunk[:room]
        if len(chunk) > room:
            truncated = True
            on_overflow()
    return Captured(bytes(kept), truncated)
