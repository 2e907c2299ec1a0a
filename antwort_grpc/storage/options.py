"""Settings every store shares: retention, upkeep, the identity of this process, the clock."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field


def new_instance_id() -> str:
    """Names this gateway process in the rows it runs (host and pid help an operator reading them)."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"


@dataclass(frozen=True, slots=True)
class StoreOptions:
    # Seconds after its last save when a stored response is removed; None keeps it forever.
    ttl_seconds: float | None = None
    # Seconds between the background passes: TTL purge; with PostgreSQL also the sweep for
    # responses of dead replicas, the cancel-flag poll and reconnecting the session.
    maintenance_interval: float = 5.0
    instance_id: str = field(default_factory=new_instance_id)
    # Wall-clock seconds; tests pass a fake one to expire responses without waiting.
    clock: Callable[[], float] = time.time
    # The memory store's bounds: past either, the oldest finished responses are evicted.
    memory_max_responses: int = 10_000
    memory_max_bytes: int = 256 * 1024 * 1024

    def expires_at(self, saved_at: float) -> float | None:
        return None if self.ttl_seconds is None else saved_at + self.ttl_seconds
