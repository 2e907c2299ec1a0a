"""Open the store named by ANTWORT_STORE.

- `memory`: in the process (tests, or a gateway that needs no durability);
- `sqlite:///abs/path/file.db` or `sqlite://relative/file.db`: one SQLite file, one gateway;
- `postgresql://user:pw@host:port/db` (or `postgres://`): shared by gateway replicas;
- empty: SQLite at `<data_dir>/antwort.db` (the directory is created).

Every store returned is also Closable, Recovery, Retention and CancelSignals (storage.base).
"""

from __future__ import annotations

from pathlib import Path

from antwort_grpc.config import GatewaySettings
from antwort_grpc.storage.base import ResponseStore
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.storage.options import StoreOptions

DEFAULT_FILE = "antwort.db"


def options_from(settings: GatewaySettings) -> StoreOptions:
    return StoreOptions(
        ttl_seconds=settings.response_ttl_seconds,
        maintenance_interval=settings.store_maintenance_seconds,
    )


def sqlite_path(url: str, data_dir: Path) -> Path | None:
    """The file a URL names, or None when it is not a SQLite URL."""
    if not url:
        return data_dir / DEFAULT_FILE
    if url.startswith("sqlite://"):
        rest = url.removeprefix("sqlite://")
        if not rest or rest == "/":
            raise ValueError(f"store {url!r} names no file: use sqlite:///path/file.db")
        return Path(rest)
    return None


async def open_store(url: str, data_dir: Path, options: StoreOptions | None = None) -> ResponseStore:
    options = options or StoreOptions()
    if url in ("memory", "memory://"):
        return MemoryStore(options)
    path = sqlite_path(url, data_dir)
    if path is not None:
        from antwort_grpc.storage.sqlite import SQLiteStore

        return await SQLiteStore.open(path, options)
    if url.startswith(("postgresql://", "postgres://")):
        from antwort_grpc.storage.postgres import PostgresStore

        return await PostgresStore.open(url, options)
    raise ValueError(f"unsupported store {url!r}: use memory, sqlite:///path/file.db or postgresql://…")
