"""How a grpc.aio server takes in new calls: several asked of grpc ahead, per method.

grpc.aio asks grpc core for one call of each method at a time and asks for the next only once
that one has come through grpc's completion queue and the event loop (about five turns of the
loop a call). While the loop is busy with hundreds of streams a turn takes tens of milliseconds,
so a burst of calls is taken in a few a second; grpc keeps the rest waiting and cancels those
that waited 30 s (`grpc.server_max_unrequested_time_in_server`). The client sees CANCELLED, as if
it had cancelled, and the gateway never sees the call: no log line, no admission, no metric.
That is what ended hundreds of the 1,000-stream benchmark's conversations (bench/RESULTS.md).

Here the server keeps AHEAD requests per method with grpc: calls that arrive together are
matched by grpc at once, while the loop is busy, and the loop hands them over at about two turns
a call, without a round trip through grpc each. It costs a few hundred idle requests (a task
each). A call matched but not yet handed over when the server stops ends CANCELLED at once,
as do the calls grpc.aio alone leaves waiting.

grpc.aio has no option for this; the server class it builds is given a subclass that answers
its per-method request hook (`_make_request_call_future`, grpcio 1.85, pinned). Should a grpcio
upgrade stop calling the hook, the server falls back to grpc.aio's own intake and
tests/test_call_intake.py fails.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Sequence
from typing import Any

import grpc
from grpc._cython import cygrpc

# Requests kept with grpc per method: a burst of this many calls needs no round trip through
# grpc's completion queue before the next is taken in.
AHEAD = 32

_building = threading.Lock()


class _AheadAioServer(cygrpc.AioServer):  # type: ignore[misc]
    """grpc.aio's server core, asking grpc for the next AHEAD calls of a method at once."""

    def _make_request_call_future(self, method: bytes | None) -> asyncio.Future[Any]:
        asked: dict[bytes | None, collections.deque[asyncio.Future[Any]]] = self.__dict__.setdefault("_asked", {})
        queue = asked.setdefault(method, collections.deque())
        while len(queue) < AHEAD:
            request = super()._make_request_call_future(method)
            # Those still asked when the server stops end with grpc's shutdown error, which no
            # one else reads.
            request.add_done_callback(_read_outcome)
            queue.append(request)
        return queue.popleft()


def _read_outcome(request: asyncio.Future[Any]) -> None:
    if not request.cancelled():
        request.exception()


def aio_server(
    *, options: Sequence[tuple[str, Any]], interceptors: Sequence[grpc.aio.ServerInterceptor]
) -> grpc.aio.Server:
    """grpc.aio.server(options, interceptors), taking new calls in AHEAD at a time per method."""
    # grpc.aio builds cygrpc.AioServer by name: the name stands for ours while this server is
    # built (nothing awaits in between; the lock keeps our builds in other threads apart).
    with _building:
        stock = cygrpc.AioServer
        cygrpc.AioServer = _AheadAioServer
        try:
            return grpc.aio.server(options=list(options), interceptors=list(interceptors))
        finally:
            cygrpc.AioServer = stock
