"""The gateway's end of a HookService Session: one stream per hook service, shared by every
response. Exchanges go out as they come; answers are matched to them by id, in whatever order they
arrive. A broken stream fails the exchanges it carried (their failure policy applies) and the next
exchange opens a new one."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.message import Message

from antwort_grpc import pb
from antwort_grpc.hooks.service import POINT_OF, POINTS, Exchange


class SessionUnimplemented(RuntimeError):
    """The service does not implement Session after all."""


@dataclass(slots=True)
class _Stream:
    call: Any  # grpc.aio.StreamStreamCall (grpc ships no type information for it)
    waiting: dict[int, asyncio.Future[pb.SessionResponse]] = field(default_factory=dict)
    reader: asyncio.Task[None] | None = None


class SessionClient:
    def __init__(self, stub: Any, target: str) -> None:
        self._stub = stub
        self._target = target
        self._stream: _Stream | None = None
        self._writing = asyncio.Lock()
        self._ids = itertools.count(1)

    async def exchange(self, calls: Sequence[Message], caller: pb.HookCaller, timeout: float) -> Exchange:
        stream = self._stream or self._open()
        exchange_id = next(self._ids)
        answered: asyncio.Future[pb.SessionResponse] = asyncio.get_running_loop().create_future()
        stream.waiting[exchange_id] = answered
        try:
            request = pb.SessionRequest(exchange_id=exchange_id, caller=caller)
            request.timeout.FromNanoseconds(int(timeout * 1e9))
            for call in calls:
                getattr(request.calls.add(), POINTS[POINT_OF[type(call)]].method).CopyFrom(call)
            try:
                async with self._writing:
                    await stream.call.write(request)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
                # The stream ended: its reader says why (and fails this exchange with it).
                pass
            reply = await answered
        finally:
            stream.waiting.pop(exchange_id, None)
        return _unpack(reply, calls)

    async def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.call.cancel()
            if stream.reader is not None:
                await asyncio.gather(stream.reader, return_exceptions=True)

    def _open(self) -> _Stream:
        stream = _Stream(self._stub.Session(wait_for_ready=False))
        stream.reader = asyncio.create_task(self._read(stream), name=f"hook-session {self._target}")
        self._stream = stream
        return stream

    async def _read(self, stream: _Stream) -> None:
        error: Exception
        try:
            while True:
                reply = await stream.call.read()
                if reply is grpc.aio.EOF:
                    error = RuntimeError("the hook service ended the session")
                    break
                answered = stream.waiting.get(reply.exchange_id)
                if answered is not None and not answered.done():
                    answered.set_result(reply)
        except grpc.aio.AioRpcError as err:
            cls = SessionUnimplemented if err.code() == grpc.StatusCode.UNIMPLEMENTED else RuntimeError
            error = cls(f"{err.code().name}: {err.details()}")
        except asyncio.CancelledError:
            error = RuntimeError("the session was closed")
        finally:
            if self._stream is stream:
                self._stream = None
        for answered in stream.waiting.values():
            if not answered.done():
                answered.set_exception(error)


def _unpack(reply: pb.SessionResponse, calls: Sequence[Message]) -> Exchange:
    """The answers as the unary RPCs' messages; an answer for another point than its call's is
    the service's failure at that call."""
    answers: list[Message] = []
    for call, answer in zip(calls, reply.answers, strict=False):
        expected = POINTS[POINT_OF[type(call)]].method
        if answer.WhichOneof("point") != expected:
            return Exchange(answers, f"it answered {answer.WhichOneof('point')} to a {expected} call")
        answers.append(getattr(answer, expected))
    return Exchange(answers, reply.error)
