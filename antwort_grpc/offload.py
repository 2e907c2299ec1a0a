"""The worker thread that takes the CPU-heavy steps of large requests off the event loop: parsing
a request over 1 MiB, checking one with many tools or items, building its backend body.

One thread, not a pool: the work is Python holding the GIL, so more threads would not finish it
sooner, and each one more is one more contender the event loop waits behind for the GIL between
its own steps (health checks, every other stream's tokens). With four requests at the limits at
once (`python -m bench.limits`), the slowest health check took 140-570 ms with this thread, and
350-770 ms with asyncio's default pool, on the same host."""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="antwort-heavy")


async def off_loop(function: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`function(*args, **kwargs)` in the worker thread (in the caller's context, as
    asyncio.to_thread runs it)."""
    context = contextvars.copy_context()
    call = functools.partial(context.run, function, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_worker, call)
