"""Background tasks: how every part (stores, remote executors, hook clients) stops one, and the
`async with` of a part that is started and closed."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Self


async def stop_task(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` and wait until it has ended: what it was doing is over when this returns."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


class Started:
    """A part that is started before use and closed after: `async with` does both (the close also
    when the block fails)."""

    async def start(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
