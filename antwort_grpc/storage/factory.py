"""Open the store named by ANTWORT_STORE.

`memory` keeps responses in the process. (SQLite and PostgreSQL stores plug in here.)
"""

from __future__ import annotations

from pathlib import Path

from antwort_grpc.storage.base import ResponseStore
from antwort_grpc.storage.memory import MemoryStore


async def open_store(url: str, data_dir: Path) -> ResponseStore:
    if url in ("memory", "memory://"):
        return MemoryStore()
    raise ValueError(f"unsupported store {url!r}: use memory")
