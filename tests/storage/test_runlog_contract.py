"""The RunLog contract (event log, checkpoints, leases, idempotency keys), the same for memory, a
SQLite file and a PostgreSQL database."""

from __future__ import annotations

import asyncio
from typing import Any

from antwort_grpc.storage.runlog import HANDED_OVER, REPLICA_LOST, Checkpoint
from tests.storage.conftest import Backend

LEASE = 10.0


def events(first: int, last: int) -> list[tuple[int, bytes]]:
    return [(n, f"event {n}".encode()) for n in range(first, last + 1)]


async def test_events_read_back_in_order_after_any_sequence_number(store: Any) -> None:
    log = store.runlog
    await log.begin("resp_1", "alice", b"request", LEASE)
    assert await log.append("resp_1", events(1, 3))
    assert await log.append("resp_1", events(4, 6), ended=True, retention=60)
    assert await log.events("resp_1", 0, 100) == events(1, 6)
    assert await log.events("resp_1", 4, 100) == events(5, 6)
    assert await log.events("resp_1", 1, 2) == events(2, 3)
    state = await log.state("resp_1", "alice")
    assert state is not None and state.last_sequence_number == 6 and state.ended
    assert not state.truncated and not state.expired


async def test_another_owners_log_reads_as_none(store: Any) -> None:
    await store.runlog.begin("resp_1", "alice", b"request", LEASE)
    assert await store.runlog.state("resp_1", "bob") is None
    assert await store.runlog.state("resp_2", "alice") is None


async def test_a_log_expires_its_retention_after_the_end_and_is_purged(backend: Backend) -> None:
    store = await backend.open()
    log = store.runlog
    await log.begin("resp_1", "", b"request", LEASE)
    await log.append("resp_1", events(1, 2), ended=True, retention=3600)
    backend.clock.advance(3599)
    state = await log.state("resp_1", "")
    assert state is not None and not state.expired
    backend.clock.advance(2)
    state = await log.state("resp_1", "")
    assert state is None or state.expired
    await log.purge_logs()
    assert await log.events("resp_1", 0, 10) == []


async def test_a_truncated_log_keeps_no_events_and_says_so(store: Any) -> None:
    log = store.runlog
    await log.begin("resp_1", "", b"request", LEASE)
    await log.append("resp_1", events(1, 3))
    await log.truncate("resp_1")
    assert await log.append("resp_1", events(4, 5), ended=True, retention=60)
    assert await log.events("resp_1", 0, 10) == []
    state = await log.state("resp_1", "")
    assert state is not None and state.truncated and state.ended and state.last_sequence_number == 5


async def test_a_replica_that_lost_its_lease_writes_nothing_more(backend: Backend) -> None:
    if backend.kind == "sqlite":
        return  # one gateway per file: see the restart below
    a, b = await backend.open(), await backend.open()
    await a.runlog.begin("resp_1", "", b"request", LEASE)
    await a.runlog.append("resp_1", events(1, 2))
    assert await a.runlog.checkpoint("resp_1", Checkpoint(b"response", 1, 0, 2))
    backend.clock.advance(LEASE + 1)
    claims = await b.runlog.claim(LEASE, 10)
    assert [c.response_id for c in claims] == ["resp_1"]
    claim = claims[0]
    assert claim.reason == REPLICA_LOST and claim.request == b"request" and claim.last_sequence_number == 2
    assert claim.checkpoint == Checkpoint(b"response", 1, 0, 2)
    assert not await a.runlog.append("resp_1", events(3, 3))
    assert not await a.runlog.checkpoint("resp_1", Checkpoint(b"late", 2, 0, 3))
    assert await a.runlog.renew(["resp_1"], LEASE) == ["resp_1"]
    assert await b.runlog.append("resp_1", events(3, 4))
    assert await b.runlog.events("resp_1", 0, 10) == events(1, 4)


async def test_a_restarted_sqlite_gateway_claims_what_the_previous_process_left_at_once(backend: Backend) -> None:
    if backend.kind != "sqlite":
        return
    a = await backend.open()
    await a.runlog.begin("resp_1", "", b"request", LEASE)
    await a.runlog.append("resp_1", events(1, 2))
    await backend.close(a)
    b = await backend.open()
    claims = await b.runlog.claim(LEASE, 10)
    assert [(c.response_id, c.reason, c.last_sequence_number) for c in claims] == [("resp_1", REPLICA_LOST, 2)]


async def test_a_replica_never_claims_its_own_run(backend: Backend) -> None:
    a = await backend.open()
    await a.runlog.begin("resp_1", "", b"request", LEASE)
    backend.clock.advance(LEASE + 1)
    assert await a.runlog.claim(LEASE, 10) == []


async def test_a_held_lease_is_renewed_and_not_claimed(backend: Backend) -> None:
    a = await backend.open()
    # One process per SQLite file: only the holder itself looks.
    b = a if backend.kind == "sqlite" else await backend.open()
    await a.runlog.begin("resp_1", "", b"request", LEASE)
    backend.clock.advance(LEASE - 1)
    assert await a.runlog.renew(["resp_1"], LEASE) == []
    backend.clock.advance(LEASE - 1)
    assert await b.runlog.claim(LEASE, 10) == []


async def test_a_claim_carries_the_events_after_the_checkpoint(backend: Backend) -> None:
    a = await backend.open()
    await a.runlog.begin("resp_1", "", b"request", LEASE)
    await a.runlog.append("resp_1", events(1, 5))
    await a.runlog.checkpoint("resp_1", Checkpoint(b"response", 1, 0, 3))
    await a.runlog.append("resp_1", events(6, 7))
    await a.runlog.release(["resp_1"])
    if backend.kind == "sqlite":
        await backend.close(a)  # one gateway per file: the next one is a restart
    b = await backend.open()
    claims = await b.runlog.claim(LEASE, 10)
    assert [c.reason for c in claims] == [HANDED_OVER]
    assert claims[0].tail == [data for _, data in events(4, 7)]
    assert await b.runlog.claim(LEASE, 10) == []


async def test_a_handover_is_heard_by_the_other_replicas(backend: Backend) -> None:
    if backend.kind == "sqlite":
        return  # one gateway per file
    a, b = await backend.open(), await backend.open()
    heard = asyncio.Event()
    b.runlog.on_handover(heard.set)
    await a.runlog.begin("resp_1", "", b"request", LEASE)
    await a.runlog.release(["resp_1"])
    async with asyncio.timeout(5):
        await heard.wait()


async def test_appends_are_heard_by_readers_on_other_replicas(backend: Backend) -> None:
    a = await backend.open()
    b = a if backend.kind == "sqlite" else await backend.open()
    heard = asyncio.Event()
    b.runlog.watch("resp_1", heard.set)
    await a.runlog.begin("resp_1", "", b"request", LEASE)
    await a.runlog.append("resp_1", events(1, 1))
    async with asyncio.timeout(5):
        await heard.wait()


async def test_an_idempotency_key_names_its_first_response_per_owner_until_it_expires(backend: Backend) -> None:
    log = (await backend.open()).runlog
    assert await log.remember("alice", "k", "digest-1", "resp_1", 100) is None
    found = await log.remember("alice", "k", "digest-2", "resp_2", 100)
    assert found is not None and (found.response_id, found.digest) == ("resp_1", "digest-1")
    assert await log.remember("bob", "k", "digest-3", "resp_3", 100) is None
    backend.clock.advance(101)
    assert await log.remember("alice", "k", "digest-4", "resp_4", 100) is None
    await log.forget("alice", "k")
    assert await log.remember("alice", "k", "digest-5", "resp_5", 100) is None


async def test_a_checkpoint_written_with_events_is_what_a_claim_resumes_from(backend: Backend) -> None:
    a = await backend.open()
    await a.runlog.begin("resp_1", "", b"request", LEASE)
    assert await a.runlog.append("resp_1", events(1, 4), checkpoint=Checkpoint(b"at 4", 2, 1, 4))
    assert await a.runlog.append("resp_1", events(5, 6))
    backend.clock.advance(LEASE + 1)
    if backend.kind == "sqlite":
        await backend.close(a)
    b = await backend.open()
    (claim,) = await b.runlog.claim(LEASE, 10)
    assert claim.checkpoint == Checkpoint(b"at 4", 2, 1, 4)
    assert claim.tail == [data for _, data in events(5, 6)]


async def test_the_next_expiry_is_when_the_first_lease_of_another_replica_runs_out(backend: Backend) -> None:
    if backend.kind == "sqlite":
        # One gateway per file: another instance's runs are claimed at once, no lease to wait for.
        store = await backend.open()
        await store.runlog.begin("resp_1", "", b"request", LEASE)
        assert await store.runlog.next_expiry() is None
        return
    a, b = await backend.open(), await backend.open()
    assert await b.runlog.next_expiry() is None
    await a.runlog.begin("resp_1", "", b"request", LEASE)
    backend.clock.advance(1)
    await a.runlog.begin("resp_2", "", b"request", LEASE)
    await b.runlog.begin("resp_3", "", b"request", 1.0)  # its own: never claimed by itself
    assert await b.runlog.next_expiry() == LEASE - 1
    assert await a.runlog.next_expiry() == 1.0
    await a.runlog.append("resp_1", events(1, 1), ended=True, retention=60)
    assert await b.runlog.next_expiry() == LEASE
    # Run out already (a look claims it now, or has no room for it): nothing to wait for.
    backend.clock.advance(LEASE + 1)
    assert await b.runlog.next_expiry() is None
