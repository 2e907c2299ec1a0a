"""Loaded by a gateway that `python -m bench.loop_turns` starts (this folder first on its
PYTHONPATH): counts the asyncio loop's turns, the callbacks it runs (by what they run), the tasks
made and the calls handed to threads. SIGUSR1 writes the counts since the last signal to
$ANTWORT_LOOP_COUNTS/<pid>.json and starts again from zero. Only the standard library's loop has a
turn to patch, so the gateway runs on it (ANTWORT_EVENT_LOOP=asyncio): uvloop runs the same
callbacks in C."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
from asyncio import base_events, events
from pathlib import Path
from typing import Any

_OUT = os.environ.get("ANTWORT_LOOP_COUNTS", "")
COUNTS: collections.Counter[str] = collections.Counter()
NAMES: collections.Counter[str] = collections.Counter()


def _named(callback: Any) -> str:
    owner = getattr(callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        coro = owner.get_coro()
        return "step of " + getattr(coro, "__qualname__", type(coro).__name__)
    if isinstance(owner, asyncio.Future):
        return "future callback"
    function = getattr(callback, "func", callback)  # functools.partial
    name = getattr(function, "__qualname__", None) or type(function).__name__
    return f"{getattr(function, '__module__', None) or ''}.{name}".lstrip(".")


def _install() -> None:
    # Any: patching methods is what typing forbids.
    loop_class: Any = base_events.BaseEventLoop
    handle_class: Any = events.Handle
    run_once = loop_class._run_once
    handle_run = handle_class._run
    create_task = loop_class.create_task
    in_executor = loop_class.run_in_executor

    def counted_turn(self: Any) -> None:
        COUNTS["turns"] += 1
        run_once(self)

    def counted_handle(self: Any) -> None:
        timer = isinstance(self, events.TimerHandle)
        COUNTS["timers" if timer else "callbacks"] += 1
        NAMES[("timer: " if timer else "") + _named(self._callback)] += 1
        handle_run(self)

    def counted_task(self: Any, coro: Any, **kwargs: Any) -> Any:
        COUNTS["tasks"] += 1
        NAMES["new task " + getattr(coro, "__qualname__", type(coro).__name__)] += 1
        return create_task(self, coro, **kwargs)

    def counted_executor(self: Any, executor: Any, function: Any, *args: Any) -> Any:
        COUNTS["to threads"] += 1
        NAMES["to a thread: " + _named(function)] += 1
        return in_executor(self, executor, function, *args)

    # Patched on the classes: every loop and handle made from now on counts.
    loop_class._run_once = counted_turn
    handle_class._run = counted_handle
    loop_class.create_task = counted_task
    loop_class.run_in_executor = counted_executor
    signal.signal(signal.SIGUSR1, _dump)


def _dump(signum: int, frame: Any) -> None:
    path = Path(_OUT) / f"{os.getpid()}.json"
    path.with_suffix(".tmp").write_text(json.dumps({"counts": COUNTS, "names": NAMES}))
    path.with_suffix(".tmp").replace(path)
    COUNTS.clear()
    NAMES.clear()


if _OUT:
    _install()
