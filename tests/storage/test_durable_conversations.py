"""A background run in a kept conversation whose replica dies as the run ends: real `antwort-grpc
serve` processes on one PostgreSQL database, kill -9, and the takeover by the other replica.

The replica is caught at its final write: the test holds a lock on the response's row, so the
write that stores the response ended waits on it; the replica is killed while it waits, and its
waiting statement is ended as PostgreSQL ends a dead client's (pg_terminate_backend), which rolls
back whatever that statement's transaction had not committed. Nothing here waits for time to
pass: each step waits for the state the next one needs."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import asyncpg

from antwort_grpc import pb
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply
from tests.storage.conftest import empty_database
from tests.storage.processes import gateway_process
from tests.storage.test_durable_runs import FAST, background, poll_ended, start_background

S = pb.ResponseStatus


def said(text: str) -> pb.Item:
    content = [pb.ContentPart(input_text=pb.InputText(text=text))]
    return pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=content))


def text_of(item: pb.Item) -> str:
    return "".join(part.input_text.text or part.output_text.text for part in item.message.content)


async def waiting_on(watcher: asyncpg.Connection, locker: asyncpg.Connection) -> int:
    """The server process of the statement that waits for a lock `locker` holds (once there is
    one), after checking it is the write of a response. Watched from a connection of its own: in
    the locker's transaction, pg_stat_activity would be the snapshot its first read took."""
    sql = "SELECT pid, query FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))"
    async with asyncio.timeout(30):
        while True:
            row = await watcher.fetchrow(sql, locker.get_server_pid())
            if row is not None:
                assert "antwort_responses" in row["query"]
                return int(row["pid"])
            await asyncio.sleep(0.02)


async def terminate(watcher: asyncpg.Connection, pid: int) -> None:
    """End a server process as PostgreSQL ends a dead client's, and wait until it is gone (its
    transaction rolled back) — a signal is handled when the process gets to it."""
    await watcher.execute("SELECT pg_terminate_backend($1)", pid)
    async with asyncio.timeout(30):
        while True:
            if not await watcher.fetchval("SELECT 1 FROM pg_stat_activity WHERE pid = $1", pid):
                return
            await asyncio.sleep(0.02)


async def test_a_background_run_whose_replica_dies_at_its_final_save_is_in_its_conversation_once(
    postgres_admin_url: str,
) -> None:
    # The first model call holds mid-answer until the test lets it go; the resumed one answers.
    fake = FakeOpenAI(Reply(text="Hello, Ada.", hold_at=1), Reply(text="Hello again, Ada."))
    async with AsyncExitStack() as stack:
        url = await stack.enter_async_context(empty_database(postgres_admin_url))
        await stack.enter_async_context(fake)
        a = await stack.enter_async_context(gateway_process(url, fake.url, **FAST))
        b = await stack.enter_async_context(gateway_process(url, fake.url, **FAST))
        conversations = pb.ConversationsServiceStub(b.channel)
        created = await conversations.CreateConversation(pb.CreateConversationRequest(items=[said("I am Ada.")]))
        conversation_id = created.conversation.id
        request = background("Greet me.")
        request.conversation_id = conversation_id
        response_id = await start_background(a, request)
        await fake.wait_held(timeout=30)
        # The response's row locked: the write that stores it ended waits.
        locker, watcher = await asyncpg.connect(url), await asyncpg.connect(url)
        stack.push_async_callback(locker.close)
        stack.push_async_callback(watcher.close)
        locking = locker.transaction()
        await locking.start()
        await locker.execute("SELECT 1 FROM antwort_responses WHERE id = $1 FOR UPDATE", response_id)
        fake.release()
        final_write = await waiting_on(watcher, locker)
        # The replica dies there; its write never commits.
        a.kill()
        await a.process.wait()
        await terminate(watcher, final_write)
        await locking.rollback()
        done = await poll_ended(b, response_id)
        listed = await conversations.ListConversationItems(
            pb.ListConversationItemsRequest(conversation_id=conversation_id, limit=100)
        )
    assert done.status == S.RESPONSE_STATUS_COMPLETED
    texts = [text_of(item) for item in listed.items]
    # The turn once: its input, then the output of the response as it is stored (what the lost
    # replica had answered is in it as an incomplete item, as in any takeover, then the answer).
    assert texts.count("Greet me.") == 1, texts
    assert texts == ["I am Ada.", "Greet me.", *[text_of(item) for item in done.output]]
    assert [item.id for item in listed.items[2:]] == [item.id for item in done.output]
    assert text_of(done.output[-1]) == "Hello again, Ada."
