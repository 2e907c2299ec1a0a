"""Schema versions of the durable stores. Append a version; never edit one that has shipped.

SQLite records its version in `PRAGMA user_version`, PostgreSQL in antwort_schema_migrations.
Both apply the missing versions inside one write transaction that first reads the version, so
two processes migrating at once (replicas starting together, `antwort-grpc migrate` next to a
gateway) apply each version exactly once.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

from antwort_grpc.storage.codec import RUNNING_SQL

if TYPE_CHECKING:
    import asyncpg
    from asyncpg.pool import PoolConnectionProxy

# The response and its input items are protobuf bytes; the other columns are what queries filter
# on. The partial index on running rows serves the interrupted-response sweep and the cancel poll.
SQLITE: list[tuple[str, ...]] = [
    (
        """CREATE TABLE antwort_responses (
            id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            status INTEGER NOT NULL,
            previous_response_id TEXT NOT NULL,
            created_at REAL NOT NULL,
            expires_at REAL,
            response BLOB NOT NULL,
            input_items BLOB NOT NULL
        )""",
        f"CREATE INDEX antwort_responses_running ON antwort_responses (id) WHERE status IN {RUNNING_SQL}",
        "CREATE INDEX antwort_responses_expiry ON antwort_responses (expires_at) WHERE expires_at IS NOT NULL",
    ),
    (
        # Background runs (storage/runlog.py): the lease, the last checkpoint, the log's state.
        # Times are epoch seconds of the gateway's clock.
        """CREATE TABLE antwort_runs (
            id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            request BLOB NOT NULL,
            lease_instance TEXT NOT NULL,
            lease_until REAL NOT NULL,
            handed_over INTEGER NOT NULL DEFAULT 0,
            last_seq INTEGER NOT NULL DEFAULT 0,
            log_bytes INTEGER NOT NULL DEFAULT 0,
            truncated INTEGER NOT NULL DEFAULT 0,
            ended INTEGER NOT NULL DEFAULT 0,
            expires_at REAL,
            cp_response BLOB,
            cp_turn INTEGER NOT NULL DEFAULT 0,
            cp_round INTEGER NOT NULL DEFAULT 0,
            cp_seq INTEGER NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX antwort_runs_open ON antwort_runs (lease_until) WHERE ended = 0",
        "CREATE INDEX antwort_runs_expiry ON antwort_runs (expires_at) WHERE expires_at IS NOT NULL",
        """CREATE TABLE antwort_events (
            response_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            event BLOB NOT NULL,
            PRIMARY KEY (response_id, seq)
        ) WITHOUT ROWID""",
        """CREATE TABLE antwort_idempotency (
            owner TEXT NOT NULL,
            key TEXT NOT NULL,
            digest TEXT NOT NULL,
            response_id TEXT NOT NULL,
            expires_at REAL NOT NULL,
            PRIMARY KEY (owner, key)
        )""",
    ),
    (
        # Which ended responses hold an item (input or output), by the item's id: what an input's
        # item_reference is found by. Rows go with their response (the trigger). Kept only once a
        # client has referred to an item (the `items_indexed` setting; the store then indexes what
        # it holds already): a database whose clients never do pays nothing for it.
        "CREATE TABLE antwort_settings (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """CREATE TABLE antwort_items (
            owner TEXT NOT NULL,
            item_id TEXT NOT NULL,
            response_id TEXT NOT NULL,
            PRIMARY KEY (owner, item_id, response_id)
        ) WITHOUT ROWID""",
        "CREATE INDEX antwort_items_response ON antwort_items (response_id)",
        """CREATE TRIGGER antwort_items_gone AFTER DELETE ON antwort_responses
            BEGIN DELETE FROM antwort_items WHERE response_id = old.id; END""",
    ),
    (
        # Conversations (storage/conversations.py): the Conversation (protobuf bytes) and the next
        # free position of its items; the items by position, and by id for lookups and cursors.
        """CREATE TABLE antwort_conversations (
            id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            conversation BLOB NOT NULL,
            next_seq INTEGER NOT NULL
        )""",
        """CREATE TABLE antwort_conversation_items (
            conversation_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            item_id TEXT NOT NULL,
            from_model INTEGER NOT NULL,
            item BLOB NOT NULL,
            PRIMARY KEY (conversation_id, seq)
        ) WITHOUT ROWID""",
        "CREATE INDEX antwort_conversation_items_id ON antwort_conversation_items (conversation_id, item_id)",
    ),
    (
        # Conversation items by id alone: an item reference finds an item in any of the caller's
        # conversations. Written only by conversation appends (a plain response pays nothing).
        "CREATE INDEX antwort_conversation_items_item ON antwort_conversation_items (item_id)",
    ),
]

POSTGRES: list[tuple[str, ...]] = [
    (
        """CREATE TABLE antwort_responses (
            id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            status SMALLINT NOT NULL,
            previous_response_id TEXT NOT NULL,
            created_at TIMESTAMPTZ NOT NULL,
            expires_at TIMESTAMPTZ,
            instance TEXT NOT NULL,
            cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
            response BYTEA NOT NULL,
            input_items BYTEA NOT NULL
        )""",
        f"CREATE INDEX antwort_responses_running ON antwort_responses (instance) WHERE status IN {RUNNING_SQL}",
        "CREATE INDEX antwort_responses_expiry ON antwort_responses (expires_at) WHERE expires_at IS NOT NULL",
    ),
    (
        # Controls on their way to the replica that runs the response, and that replica's answer
        # (a ControlRejected; code 0 when it was accepted).
        """CREATE TABLE antwort_controls (
            id BIGSERIAL PRIMARY KEY,
            response_id TEXT NOT NULL,
            instance TEXT NOT NULL,
            control BYTEA NOT NULL,
            answer BYTEA,
            created_at TIMESTAMPTZ NOT NULL DEFAULT now()
        )""",
        "CREATE INDEX antwort_controls_open ON antwort_controls (instance) WHERE answer IS NULL",
    ),
    (
        # Background runs (storage/runlog.py), as in SQLite's version 2. Lease and expiry times are
        # epoch seconds of the replicas' clocks (kept in step by NTP; the lease has the margin).
        """CREATE TABLE antwort_runs (
            id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            request BYTEA NOT NULL,
            lease_instance TEXT NOT NULL,
            lease_until DOUBLE PRECISION NOT NULL,
            handed_over BOOLEAN NOT NULL DEFAULT FALSE,
            last_seq INTEGER NOT NULL DEFAULT 0,
            log_bytes BIGINT NOT NULL DEFAULT 0,
            truncated BOOLEAN NOT NULL DEFAULT FALSE,
            ended BOOLEAN NOT NULL DEFAULT FALSE,
            expires_at DOUBLE PRECISION,
            cp_response BYTEA,
            cp_turn INTEGER NOT NULL DEFAULT 0,
            cp_round INTEGER NOT NULL DEFAULT 0,
            cp_seq INTEGER NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX antwort_runs_open ON antwort_runs (lease_until) WHERE NOT ended",
        "CREATE INDEX antwort_runs_expiry ON antwort_runs (expires_at) WHERE expires_at IS NOT NULL",
        """CREATE TABLE antwort_events (
            response_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            event BYTEA NOT NULL,
            PRIMARY KEY (response_id, seq)
        )""",
        """CREATE TABLE antwort_idempotency (
            owner TEXT NOT NULL,
            key TEXT NOT NULL,
            digest TEXT NOT NULL,
            response_id TEXT NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (owner, key)
        )""",
    ),
    (
        # As SQLite's version 3: which ended responses hold an item, for item references, kept
        # only once a client has referred to an item (the `items_indexed` setting).
        "CREATE TABLE antwort_settings (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """CREATE TABLE antwort_items (
            owner TEXT NOT NULL,
            item_id TEXT NOT NULL,
            response_id TEXT NOT NULL REFERENCES antwort_responses (id) ON DELETE CASCADE,
            PRIMARY KEY (owner, item_id, response_id)
        )""",
        "CREATE INDEX antwort_items_response ON antwort_items (response_id)",
    ),
    (
        # As SQLite's version 4: conversations and their items.
        """CREATE TABLE antwort_conversations (
            id TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            conversation BYTEA NOT NULL,
            next_seq INTEGER NOT NULL
        )""",
        """CREATE TABLE antwort_conversation_items (
            conversation_id TEXT NOT NULL REFERENCES antwort_conversations (id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            item_id TEXT NOT NULL,
            from_model BOOLEAN NOT NULL,
            item BYTEA NOT NULL,
            PRIMARY KEY (conversation_id, seq)
        )""",
        "CREATE INDEX antwort_conversation_items_id ON antwort_conversation_items (conversation_id, item_id)",
    ),
    (
        # As SQLite's version 5: conversation items by id alone, for item references.
        "CREATE INDEX antwort_conversation_items_item ON antwort_conversation_items (item_id)",
    ),
]

# Any constant: serializes migrations between processes starting at the same time.
_PG_LOCK = 0x616E7477


def migrate_sqlite(conn: sqlite3.Connection) -> int:
    """Apply the missing versions; the version reached. `conn` is in autocommit mode
    (isolation_level=None)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        current = int(conn.execute("PRAGMA user_version").fetchone()[0])
        for version, statements in enumerate(SQLITE[current:], start=current + 1):
            for statement in statements:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return len(SQLITE)


async def migrate_postgres(conn: asyncpg.Connection[Any] | PoolConnectionProxy[Any]) -> int:
    """Apply the missing versions in one transaction; the version reached."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _PG_LOCK)
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS antwort_schema_migrations (
                version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"""
        )
        current = await conn.fetchval("SELECT coalesce(max(version), 0) FROM antwort_schema_migrations")
        for version, statements in enumerate(POSTGRES[current:], start=current + 1):
            for statement in statements:
                await conn.execute(statement)
            await conn.execute("INSERT INTO antwort_schema_migrations (version) VALUES ($1)", version)
    return len(POSTGRES)
