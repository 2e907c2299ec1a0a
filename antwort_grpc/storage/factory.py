"""Open the store named by ANTWORT_STORE.

- `memory`: in the process (tests, or a gateway that needs no durability);
- `sqlite:///abs/path/file.db` or `sqlite://relative/file.db`: one SQLite file, one gateway;
- `postgresql://user:pw@host:port/db` (or `postgres://`): shared by gateway replicas;
- empty: SQLite at `<data_dir>/antwort.db` (the directory is created).

Every store returned is also CancelSignals and Closable (storage.base).
"""

from __future__ import annotations

from pathlib import Path

from antwort_grpc.config import GatewaySettings
from antwort_grpc.storage.base import ResponseStore
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.storage.options import StoreOptions

DEFAULT_FILE = "antwort.db"


def options_from(settings: GatewaySettings) -> StoreOptions:
    return settings.part(
        StoreOptions,
        keep=("instance_id", "clock"),
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


def _is_postgres(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def _is_memory(url: str) -> bool:
    return url in ("memory", "memory://")


def _unsupported(url: str) -> ValueError:
    return ValueError(f"unsupported store {url!r}: use memory, sqlite:///path/file.db or postgresql://…")


async def open_store(url: str, data_dir: Path, options: StoreOptions | None = None) -> ResponseStore:
    options = options or StoreOptions()
    if _is_memory(url):
        return MemoryStore(options)
    path = sqlite_path(url, data_dir)
    if path is not None:
        from antwort_grpc.storage.sqlite import SQLiteStore

        return await SQLiteStore.open(path, options)
    if _is_postgres(url):
        from antwort_grpc.storage.postgres import PostgresStore

        return await PostgresStore.open(url, options)
    raise _unsupported(url)


async def migrate(url: str, data_dir: Path) -> str:
    """Apply the schema migrations of the store a URL names, and nothing else; what was done."""
    if _is_memory(url):
        return "the memory store has no schema"
    path = sqlite_path(url, data_dir)
    if path is not None:
        from antwort_grpc.storage.sqlite import migrate_file

        return f"{path}: schema version {migrate_file(path)}"
    if _is_postgres(url):
        from antwort_grpc.storage.postgres import migrate_database

        return f"PostgreSQL: schema version {await migrate_database(url)}"
    raise _unsupported(url)
