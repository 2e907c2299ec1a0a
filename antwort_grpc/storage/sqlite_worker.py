"""A sqlite3 connection owned by one thread, driven from asyncio.

The event loop never waits on the database: it queues a job and awaits a future. The writer
thread takes every job that is waiting and runs them in one transaction (a savepoint each, so one
failing job fails alone) with a single commit: concurrent conversations share commits instead of
contending for the write lock, so "database is locked" cannot happen inside one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")
Job = Callable[[sqlite3.Connection], T]

# Jobs per group commit: bounds how long one transaction holds the write lock.
MAX_BATCH = 256
# Another process (`antwort-grpc migrate`, a backup) may hold the lock briefly.
BUSY_TIMEOUT_MS = 10_000


@dataclass(slots=True)
class _Pending(Generic[T]):
    fn: Job[T]
    future: asyncio.Future[T]
    loop: asyncio.AbstractEventLoop
    # Runs on its own, outside the group transaction (it manages transactions itself).
    alone: bool = False


def _resolve(job: _Pending[Any], result: Any, error: BaseException | None) -> None:
    def settle() -> None:
        if job.future.done():  # the awaiting task was cancelled; the job ran anyway
            return
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result)

    with contextlib.suppress(RuntimeError):  # the loop has closed
        job.loop.call_soon_threadsafe(settle)


class SQLiteWorker:
    def __init__(self, path: Path, *, writer: bool, synchronous: str = "NORMAL") -> None:
        self.path = path
        self.writer = writer
        self.synchronous = synchronous
        self._queue: queue.SimpleQueue[_Pending[Any] | None] = queue.SimpleQueue()
        self._ready: asyncio.Future[None] | None = None
        self._thread = threading.Thread(
            target=self._main, name=f"sqlite-{'writer' if writer else 'reader'}", daemon=True
        )
        self.commits = 0  # group commits so far (measurements)
        self._closed = False

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._thread.start()
        await self._ready

    async def run(self, fn: Job[T], *, alone: bool = False) -> T:
        if self._closed:
            raise sqlite3.ProgrammingError(f"the SQLite store {self.path} is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put(_Pending(fn, future, loop, alone))
        return await future

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._thread.ident is None:  # never started
            return
        self._queue.put(None)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)

    # -- on the thread ------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: transactions are explicit (BEGIN/COMMIT below), never implicit.
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if self.writer:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        else:
            conn.execute("PRAGMA query_only = ON")
        return conn

    def _main(self) -> None:
        assert self._ready is not None
        ready = self._ready
        try:
            conn = self._connect()
        except BaseException as err:
            ready.get_loop().call_soon_threadsafe(ready.set_exception, err)
            return
        ready.get_loop().call_soon_threadsafe(ready.set_result, None)
        batch: list[_Pending[Any]] = []
        try:
            while True:
                batch, stop = self._take()
                group: list[_Pending[Any]] = []
                for job in batch:
                    if self.writer and not job.alone:
                        group.append(job)
                        continue
                    if group:
                        self._run_group(conn, group)
                        group = []
                    self._run_one(conn, job)
                if group:
                    self._run_group(conn, group)
                if stop:
                    return
        except BaseException as err:
            # A broken connection: nobody may wait forever on a job this thread will never run.
            self._closed = True
            for job in batch:
                _resolve(job, None, err)
            while True:
                try:
                    pending = self._queue.get_nowait()
                except queue.Empty:
                    break
                if pending is not None:
                    _resolve(pending, None, err)
            raise
        finally:
            conn.close()

    def _take(self) -> tuple[list[_Pending[Any]], bool]:
        first = self._queue.get()
        if first is None:
            return [], True
        batch = [first]
        while len(batch) < MAX_BATCH:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                return batch, True
            batch.append(job)
        return batch, False

    @staticmethod
    def _run_one(conn: sqlite3.Connection, job: _Pending[Any]) -> None:
        try:
            result = job.fn(conn)
        except BaseException as err:
            _resolve(job, None, err)
        else:
            _resolve(job, result, None)

    def _run_group(self, conn: sqlite3.Connection, batch: list[_Pending[Any]]) -> None:
        outcomes: list[tuple[_Pending[Any], Any, BaseException | None]] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as err:
            for job in batch:
                _resolve(job, None, err)
            return
        for job in batch:
            conn.execute("SAVEPOINT job")
            try:
                result = job.fn(conn)
            except Exception as err:
                conn.execute("ROLLBACK TO job")
                conn.execute("RELEASE job")
                outcomes.append((job, None, err))
            else:
                conn.execute("RELEASE job")
                outcomes.append((job, result, None))
        try:
            conn.execute("COMMIT")
            self.commits += 1
        except sqlite3.Error as err:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            outcomes = [(job, None, err) for job, _, _ in outcomes]
        # Only after the commit: a save that returned is on disk.
        for job, result, error in outcomes:
            _resolve(job, result, error)
