"""The event loop the service's processes run on.

uvloop by default: the same gateway costs about a fifth fewer CPU instructions per request on it
(callgrind, `python -m bench.instructions`), because scheduling a callback, creating a task and one
turn of the loop run in C instead of Python, and a response takes some twenty turns of the loop.
`ANTWORT_EVENT_LOOP=asyncio` runs the standard library's loop instead (what the service ran on
before; kept as a way out should a platform have no uvloop wheel).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

from antwort_grpc.startup_errors import StartupError

T = TypeVar("T")

EventLoopName = Literal["uvloop", "asyncio"]
DEFAULT: EventLoopName = "uvloop"
SETTING = "ANTWORT_EVENT_LOOP"


def chosen(name: str | None = None) -> EventLoopName:
    """`name`, else the setting, else the default; StartupError naming the setting otherwise."""
    value = (name or os.environ.get(SETTING) or DEFAULT).strip().lower()
    if value == "asyncio":
        return "asyncio"
    if value == "uvloop":
        return "uvloop"
    raise StartupError(f"{SETTING}: unknown event loop {value!r} (uvloop, asyncio)")


def run(main: Coroutine[Any, Any, T], name: str | None = None) -> T:
    """asyncio.run on the chosen loop."""
    try:
        which = chosen(name)
    except StartupError:
        main.close()  # never started: no "was never awaited" warning beside the one line
        raise
    if which == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
