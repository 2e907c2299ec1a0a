"""A queue a run reads while it waits: what it waits for arrives on it, and so does the bell.

Leaner than asyncio.Queue: it is on the path of every streamed delta. Producers never wait; the
one reader does.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

# What a control puts on the channel of the wait the run is in.
RING = object()


class Channel:
    __slots__ = ("_getter", "_items")

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._getter: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self._items)

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        getter = self._getter
        if getter is not None:
            self._getter = None
            if not getter.done():
                getter.set_result(None)

    def take_all(self) -> list[Any]:
        items = list(self._items)
        self._items.clear()
        return items

    def extend(self, items: list[Any]) -> None:
        self._items.extend(items)

    def ring(self) -> None:
        self.put_nowait(RING)

    def get_nowait(self) -> Any:
        return self._items.popleft()

    async def get(self) -> Any:
        while not self._items:
            self._getter = asyncio.get_running_loop().create_future()
            try:
                await self._getter
            finally:
                self._getter = None
        return self.get_nowait()
