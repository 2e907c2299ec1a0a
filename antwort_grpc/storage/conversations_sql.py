"""Conversations in the durable stores (storage/conversations.py): SQLite through the store's
writer and reader threads, PostgreSQL through its pool.

A conversation's row holds the Conversation (protobuf bytes) and the next free position; items
are rows keyed by (conversation, position). An append reads and advances the next position in
the transaction that inserts the items: SQLite's one writer serializes appends, PostgreSQL locks
the conversation's row (FOR UPDATE), so concurrent appends (two replicas included) keep every
item, each append's block whole.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from antwort_grpc import pb
from antwort_grpc.storage.base import ItemPage
from antwort_grpc.storage.conversations import Entry
from antwort_grpc.storage.sqlite_worker import SQLiteWorker

if TYPE_CHECKING:
    import asyncpg

    Pool = asyncpg.Pool[asyncpg.Record]

_ITEMS = "antwort_conversation_items"
# Past every position (INTEGER columns: 32 bits in PostgreSQL).
_AFTER_ALL = 2**31 - 1


# An item of the owner's conversations by id: from the preferred conversation, else the least id.
_FIND = f"""SELECT i.item FROM {_ITEMS} i JOIN antwort_conversations c ON c.id = i.conversation_id
    WHERE i.item_id = ? AND c.owner = ? ORDER BY i.conversation_id = ? DESC, i.conversation_id, i.seq LIMIT 1"""
_PG_FIND = f"""SELECT DISTINCT ON (i.item_id) i.item_id, i.item FROM {_ITEMS} i
    JOIN antwort_conversations c ON c.id = i.conversation_id
    WHERE i.item_id = ANY($1::text[]) AND c.owner = $2
    ORDER BY i.item_id, i.conversation_id = $3 DESC, i.conversation_id, i.seq"""


def _conversation(data: bytes) -> pb.Conversation:
    return pb.Conversation.FromString(data)


def _rows(conversation_id: str, first: int, entries: Sequence[Entry]) -> list[tuple[Any, ...]]:
    return [
        (conversation_id, first + n, e.item.id, e.from_model, e.item.SerializeToString()) for n, e in enumerate(entries)
    ]


def _page(rows: list[Any], limit: int) -> ItemPage:
    items = [pb.Item.FromString(row[0]) for row in rows[:limit]]
    return ItemPage(items, len(rows) > limit)


class SQLiteConversations:
    def __init__(self, writer: SQLiteWorker, reader: SQLiteWorker) -> None:
        self.writer = writer
        self.reader = reader

    async def create(self, conversation: pb.Conversation, items: Sequence[pb.Item], owner: str) -> None:
        entries = [Entry(item) for item in items]

        def create(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO antwort_conversations (id, owner, conversation, next_seq) VALUES (?, ?, ?, ?)",
                (conversation.id, owner, conversation.SerializeToString(), len(entries)),
            )
            conn.executemany(f"INSERT INTO {_ITEMS} VALUES (?, ?, ?, ?, ?)", _rows(conversation.id, 0, entries))

        await self.writer.run(create)

    async def get(self, conversation_id: str, owner: str) -> pb.Conversation | None:
        sql = "SELECT conversation FROM antwort_conversations WHERE id = ? AND owner = ?"
        row = await self.reader.run(lambda conn: conn.execute(sql, (conversation_id, owner)).fetchone())
        return None if row is None else _conversation(row[0])

    async def update(self, conversation_id: str, metadata: Mapping[str, str], owner: str) -> pb.Conversation | None:
        def update(conn: sqlite3.Connection) -> pb.Conversation | None:
            sql = "SELECT conversation FROM antwort_conversations WHERE id = ? AND owner = ?"
            row = conn.execute(sql, (conversation_id, owner)).fetchone()
            if row is None:
                return None
            conversation = _conversation(row[0])
            conversation.metadata.clear()
            conversation.metadata.update(metadata)
            sql = "UPDATE antwort_conversations SET conversation = ? WHERE id = ?"
            conn.execute(sql, (conversation.SerializeToString(), conversation_id))
            return conversation

        return await self.writer.run(update)

    async def delete(self, conversation_id: str, owner: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            sql = "DELETE FROM antwort_conversations WHERE id = ? AND owner = ?"
            if conn.execute(sql, (conversation_id, owner)).rowcount == 0:
                return False
            conn.execute(f"DELETE FROM {_ITEMS} WHERE conversation_id = ?", (conversation_id,))
            return True

        return await self.writer.run(delete)

    async def append(self, conversation_id: str, entries: Sequence[Entry], owner: str) -> bool:
        return await self.writer.run(lambda conn: sqlite_append(conn, conversation_id, entries, owner))

    async def list_items(
        self, conversation_id: str, *, limit: int, after: str, descending: bool, owner: str
    ) -> ItemPage | None:
        order, beyond = ("DESC", "<") if descending else ("ASC", ">")

        def read(conn: sqlite3.Connection) -> ItemPage | None:
            if not _owned(conn, conversation_id, owner):
                return None
            start = -1 if not descending else _AFTER_ALL
            if after:
                found = conn.execute(
                    f"SELECT min(seq) FROM {_ITEMS} WHERE conversation_id = ? AND item_id = ?", (conversation_id, after)
                ).fetchone()
                if found[0] is None:
                    return ItemPage([], False)
                start = found[0]
            rows = conn.execute(
                f"SELECT item FROM {_ITEMS} WHERE conversation_id = ? AND seq {beyond} ? ORDER BY seq {order} LIMIT ?",
                (conversation_id, start, limit + 1),
            ).fetchall()
            return _page(rows, limit)

        return await self.reader.run(read)

    async def get_item(self, conversation_id: str, item_id: str, owner: str) -> pb.Item | None:
        def read(conn: sqlite3.Connection) -> pb.Item | None:
            if not _owned(conn, conversation_id, owner):
                return None
            sql = f"SELECT item FROM {_ITEMS} WHERE conversation_id = ? AND item_id = ? ORDER BY seq LIMIT 1"
            row = conn.execute(sql, (conversation_id, item_id)).fetchone()
            return None if row is None else pb.Item.FromString(row[0])

        return await self.reader.run(read)

    async def delete_item(self, conversation_id: str, item_id: str, owner: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            if not _owned(conn, conversation_id, owner):
                return False
            sql = f"""DELETE FROM {_ITEMS} WHERE conversation_id = ? AND seq =
                (SELECT min(seq) FROM {_ITEMS} WHERE conversation_id = ? AND item_id = ?)"""
            return conn.execute(sql, (conversation_id, conversation_id, item_id)).rowcount > 0

        return await self.writer.run(delete)

    async def find_items(self, item_ids: Sequence[str], owner: str, prefer: str = "") -> dict[str, pb.Item]:
        def read(conn: sqlite3.Connection) -> dict[str, pb.Item]:
            found: dict[str, pb.Item] = {}
            for item_id in dict.fromkeys(item_ids):
                row = conn.execute(_FIND, (item_id, owner, prefer)).fetchone()
                if row is not None:
                    found[item_id] = pb.Item.FromString(row[0])
            return found

        return await self.reader.run(read)

    async def entries(self, conversation_id: str, owner: str) -> list[Entry] | None:
        def read(conn: sqlite3.Connection) -> list[Entry] | None:
            if not _owned(conn, conversation_id, owner):
                return None
            sql = f"SELECT item, from_model FROM {_ITEMS} WHERE conversation_id = ? ORDER BY seq"
            rows = conn.execute(sql, (conversation_id,)).fetchall()
            return [Entry(pb.Item.FromString(item), bool(from_model)) for item, from_model in rows]

        return await self.reader.run(read)


def sqlite_append(conn: sqlite3.Connection, conversation_id: str, entries: Sequence[Entry], owner: str) -> bool:
    """An append in the writer's transaction (the store's final save of a response shares it)."""
    sql = "SELECT next_seq FROM antwort_conversations WHERE id = ? AND owner = ?"
    row = conn.execute(sql, (conversation_id, owner)).fetchone()
    if row is None:
        return False
    conn.executemany(f"INSERT INTO {_ITEMS} VALUES (?, ?, ?, ?, ?)", _rows(conversation_id, row[0], entries))
    sql = "UPDATE antwort_conversations SET next_seq = ? WHERE id = ?"
    conn.execute(sql, (row[0] + len(entries), conversation_id))
    return True


def _owned(conn: sqlite3.Connection, conversation_id: str, owner: str) -> bool:
    sql = "SELECT 1 FROM antwort_conversations WHERE id = ? AND owner = ?"
    return conn.execute(sql, (conversation_id, owner)).fetchone() is not None


class PostgresConversations:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def create(self, conversation: pb.Conversation, items: Sequence[pb.Item], owner: str) -> None:
        entries = [Entry(item) for item in items]
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO antwort_conversations (id, owner, conversation, next_seq) VALUES ($1, $2, $3, $4)",
                conversation.id,
                owner,
                conversation.SerializeToString(),
                len(entries),
            )
            if entries:
                await conn.executemany(
                    f"INSERT INTO {_ITEMS} VALUES ($1, $2, $3, $4, $5)", _rows(conversation.id, 0, entries)
                )

    async def get(self, conversation_id: str, owner: str) -> pb.Conversation | None:
        sql = "SELECT conversation FROM antwort_conversations WHERE id = $1 AND owner = $2"
        data = await self.pool.fetchval(sql, conversation_id, owner)
        return None if data is None else _conversation(data)

    async def update(self, conversation_id: str, metadata: Mapping[str, str], owner: str) -> pb.Conversation | None:
        async with self.pool.acquire() as conn, conn.transaction():
            sql = "SELECT conversation FROM antwort_conversations WHERE id = $1 AND owner = $2 FOR UPDATE"
            data = await conn.fetchval(sql, conversation_id, owner)
            if data is None:
                return None
            conversation = _conversation(data)
            conversation.metadata.clear()
            conversation.metadata.update(metadata)
            sql = "UPDATE antwort_conversations SET conversation = $2 WHERE id = $1"
            await conn.execute(sql, conversation_id, conversation.SerializeToString())
            return conversation

    async def delete(self, conversation_id: str, owner: str) -> bool:
        # The items go with it (ON DELETE CASCADE).
        status: str = await self.pool.execute(
            "DELETE FROM antwort_conversations WHERE id = $1 AND owner = $2", conversation_id, owner
        )
        return status != "DELETE 0"

    async def append(self, conversation_id: str, entries: Sequence[Entry], owner: str) -> bool:
        async with self.pool.acquire() as conn, conn.transaction():
            return await postgres_append(conn, conversation_id, entries, owner)

    async def list_items(
        self, conversation_id: str, *, limit: int, after: str, descending: bool, owner: str
    ) -> ItemPage | None:
        order, beyond = ("DESC", "<") if descending else ("ASC", ">")
        async with self.pool.acquire() as conn:
            if not await _pg_owned(conn, conversation_id, owner):
                return None
            start = -1 if not descending else _AFTER_ALL
            if after:
                sql = f"SELECT min(seq) FROM {_ITEMS} WHERE conversation_id = $1 AND item_id = $2"
                found = await conn.fetchval(sql, conversation_id, after)
                if found is None:
                    return ItemPage([], False)
                start = found
            rows = await conn.fetch(
                f"""SELECT item FROM {_ITEMS} WHERE conversation_id = $1 AND seq {beyond} $2
                    ORDER BY seq {order} LIMIT $3""",
                conversation_id,
                start,
                limit + 1,
            )
        return _page(list(rows), limit)

    async def get_item(self, conversation_id: str, item_id: str, owner: str) -> pb.Item | None:
        sql = f"""SELECT i.item FROM {_ITEMS} i JOIN antwort_conversations c ON c.id = i.conversation_id
            WHERE c.id = $1 AND c.owner = $2 AND i.item_id = $3 ORDER BY i.seq LIMIT 1"""
        data = await self.pool.fetchval(sql, conversation_id, owner, item_id)
        return None if data is None else pb.Item.FromString(data)

    async def delete_item(self, conversation_id: str, item_id: str, owner: str) -> bool:
        sql = f"""DELETE FROM {_ITEMS} WHERE conversation_id = $1 AND seq =
            (SELECT min(i.seq) FROM {_ITEMS} i JOIN antwort_conversations c ON c.id = i.conversation_id
             WHERE c.id = $1 AND c.owner = $2 AND i.item_id = $3)"""
        status: str = await self.pool.execute(sql, conversation_id, owner, item_id)
        return status != "DELETE 0"

    async def find_items(self, item_ids: Sequence[str], owner: str, prefer: str = "") -> dict[str, pb.Item]:
        rows = await self.pool.fetch(_PG_FIND, list(dict.fromkeys(item_ids)), owner, prefer)
        return {row[0]: pb.Item.FromString(row[1]) for row in rows}

    async def entries(self, conversation_id: str, owner: str) -> list[Entry] | None:
        async with self.pool.acquire() as conn:
            if not await _pg_owned(conn, conversation_id, owner):
                return None
            sql = f"SELECT item, from_model FROM {_ITEMS} WHERE conversation_id = $1 ORDER BY seq"
            rows = await conn.fetch(sql, conversation_id)
        return [Entry(pb.Item.FromString(row[0]), bool(row[1])) for row in rows]


async def _pg_owned(conn: Any, conversation_id: str, owner: str) -> bool:
    sql = "SELECT 1 FROM antwort_conversations WHERE id = $1 AND owner = $2"
    return await conn.fetchval(sql, conversation_id, owner) is not None


async def postgres_append(conn: Any, conversation_id: str, entries: Sequence[Entry], owner: str) -> bool:
    """An append in the caller's transaction (the store's final save of a response may share it):
    the conversation's row stays locked until that transaction ends."""
    sql = "SELECT next_seq FROM antwort_conversations WHERE id = $1 AND owner = $2 FOR UPDATE"
    first = await conn.fetchval(sql, conversation_id, owner)
    if first is None:
        return False
    await conn.executemany(f"INSERT INTO {_ITEMS} VALUES ($1, $2, $3, $4, $5)", _rows(conversation_id, first, entries))
    sql = "UPDATE antwort_conversations SET next_seq = $2 WHERE id = $1"
    await conn.execute(sql, conversation_id, first + len(entries))
    return True
