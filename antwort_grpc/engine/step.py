"""A step of the loop that streams events and then has a result: iterate `events`, read `result`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Generic, TypeVar

from antwort_grpc import pb

R = TypeVar("R")


class Step(Generic[R]):
    """Subclasses implement `events()`, which sets `result` before it ends."""

    __slots__ = ("_ended", "_result")

    def __init__(self) -> None:
        self._result: R | None = None
        self._ended = False

    def events(self) -> AsyncIterator[pb.StreamEvent]:
        raise NotImplementedError

    @property
    def result(self) -> R:
        assert self._ended, "read a step's result after its events"
        return self._result  # type: ignore[return-value]

    @property
    def ended(self) -> bool:
        return self._ended

    def end(self, result: R) -> None:
        self._result = result
        self._ended = True
