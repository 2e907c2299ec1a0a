"""Where the CPU-heavy steps of large requests run instead of the event loop.

`off_loop`: one worker thread, for parsing a request over 1 MiB, checking one with many tools or
items, building its backend body, making the lifecycle events of a Response that echoes
large tools. One thread, not a pool: the work is Python holding the GIL, so
more threads would not finish it sooner, and each one more is one more contender the event loop
waits behind for the GIL between its own steps (health checks, every other stream's tokens).

`in_process` (from the worker thread) and `off_process` (awaited on the event loop): one worker
process, for the part of that work that is pure Python walking data and has a small, picklable
boundary: checking schemas never seen before (bytes in, a verdict and JSON text out;
`responses/schemas.py`), and parsing and mapping a large JSON body of the HTTP door (bytes in,
the serialized request out; `http/body.py`). In the worker thread the same walks would hold the gateway's
GIL for about 0.2 s per request at the limits, 5 ms at a time, and the event loop would wait up
to 5 ms for it at every step of every other call (docs/limits.md has the figures). The process
is started on first use (about 1 s, once), `spawn`ed: gRPC's threads do not survive a fork
(so it imports the program's main module again, as multiprocessing does: `antwort-grpc serve`
and `python -m …` are safe)."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import multiprocessing
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import ParamSpec, TypeVar

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="antwort-heavy")
_process: ProcessPoolExecutor | None = None
_process_lock = threading.Lock()


async def off_loop(function: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`function(*args, **kwargs)` in the worker thread (in the caller's context, as
    asyncio.to_thread runs it)."""
    context = contextvars.copy_context()
    call = functools.partial(context.run, function, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_worker, call)


def in_process(function: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`function(*args, **kwargs)` in the worker process, waited for here (the GIL free
    meanwhile). Blocks: call it from the worker thread, never on the event loop. `function`, its
    arguments and its result must pickle, and it must be pure: when the process has died (killed,
    out of memory) it runs here instead, and the next call starts a new process."""
    process = _pool()
    try:
        return process.submit(function, *args, **kwargs).result()
    except BrokenProcessPool:
        _broken(process)
        return function(*args, **kwargs)


async def off_process(function: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`function(*args, **kwargs)` in the worker process, awaited on the event loop: no thread
    of the gateway waits for it, and nothing of it holds the GIL but the pickled bytes going
    and coming. As `in_process`: it must pickle and be pure; when the process has died it runs in
    the worker thread instead. Cancelled, the caller stops waiting (the process finishes it)."""
    process = _pool()
    try:
        return await asyncio.wrap_future(process.submit(function, *args, **kwargs))
    except BrokenProcessPool:
        _broken(process)
        return await off_loop(function, *args, **kwargs)


def _pool() -> ProcessPoolExecutor:
    global _process
    with _process_lock:
        if _process is None:
            _process = ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_process
            )
        return _process


def _broken(process: ProcessPoolExecutor) -> None:
    global _process
    log.warning("the worker process ended unexpectedly; a new one is started for the next large request")
    with _process_lock:
        if _process is process:
            _process = None
    process.shutdown(wait=False)


def _worker_process() -> None:
    # Ctrl-C reaches the whole process group: the gateway shuts down, and ends this process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def process_started() -> bool:
    """Whether the worker process has been started (by a request large enough to need it)."""
    return _process is not None
