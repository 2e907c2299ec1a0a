"""What durable runs are tuned by (docs/durable-runs.md, "The event log")."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DurableSettings:
    # Seconds a replica holds a run without renewing; another takes it over after that.
    lease_seconds: float = 10.0
    # Seconds the event log is kept after the run ended.
    log_retention_seconds: float = 3600.0
    # Bytes of events one response's log may hold; beyond it only the final response is kept.
    log_max_bytes: int = 16 * 1024 * 1024
    # Seconds an idempotency key names its response.
    idempotency_ttl_seconds: float = 24 * 3600.0
    # Runs one replica claims in one look.
    claim_batch: int = 64

    @property
    def upkeep_interval(self) -> float:
        """Renew well before the lease runs out; look for lost runs as often."""
        return self.lease_seconds / 4
