"""The HTTP door's open connections, bounded: per door and per peer address.

The gate is the door's protocol factory (asyncio calls it for every accepted connection). A
connection past a bound is answered a minimal `503` with `Retry-After` and closed, before aiohttp
sees it; every other one goes to aiohttp's request handler. Past `PRESSURE` of the door's bound,
connections that have waited longer than `pressure_idle` seconds for their next request (kept
alive, or opened and silent) are closed to make room: the idle timeout, normally
ANTWORT_HTTP_IDLE_TIMEOUT, is that much shorter while the door is crowded. A connection with a
request in progress (a stream) is never closed so.

Why a bound at all: a connection is a file descriptor, and the process has a fixed number of them
(antwort_grpc/open_files.py); without one, idle HTTP connections took them all and new gRPC
connections failed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import grpc
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from antwort_grpc.errors import RequestError
from antwort_grpc.http.errors import plain_error

log = logging.getLogger(__name__)

# The share of the door's bound past which idle connections are closed to make room.
PRESSURE = 0.8
# The most refused connections that may linger (reading what the client still sends, so closing
# does not reset the connection before the client read its 503; a sixteenth of the door's bound
# when that is less); past it they are closed at once.
MOST_LINGERING = 256
LINGER = 1.0
# Scans for idle connections at most this often (each walks every open connection).
SCAN_INTERVAL = 0.25
# A warning about refused connections at most this often.
WARN_INTERVAL = 10.0
# How a refused connection is counted (antwort_requests_refused: method, code, reason).
METHOD = "HTTP connection"
DOOR = ("ANTWORT_HTTP_MAX_CONNECTIONS", "too_many_connections")
PER_PEER = ("ANTWORT_HTTP_MAX_CONNECTIONS_PER_PEER", "too_many_connections_per_peer")


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """0: no such bound."""

    max_connections: int = 0
    max_per_peer: int = 0
    # Seconds a connection may wait for its next request while the door is past PRESSURE.
    pressure_idle: float = 1.0
    retry_after: int = 1


def connection_limits(
    max_connections: int | None, max_per_peer: int | None, default: int, pressure_idle: float = 1.0
) -> ConnectionLimits:
    """The door's limits from its settings: unset, `default` (from the descriptor limit) for the
    door and half the door's for one peer (the rest stays for other clients, health probes among
    them)."""
    door = default if max_connections is None else max_connections
    peer = door // 2 if max_per_peer is None else max_per_peer
    return ConnectionLimits(max_connections=door, max_per_peer=peer, pressure_idle=pressure_idle)


def waiting_since(handler: RequestHandler) -> float | None:
    """When the connection began waiting for its next request (the loop's clock), or None while
    it has one in progress. aiohttp's own test before it closes a kept-alive connection
    (`RequestHandler._process_keepalive`): its waiter for the next request is pending, and its
    keep-alive deadline, set at the opening and at the end of each response, is the timeout past
    that moment. Private attributes of the pinned aiohttp: tests/test_http_connections.py holds
    them to it."""
    waiter = getattr(handler, "_waiter", None)
    if waiter is None or waiter.done():
        return None
    deadline: float = getattr(handler, "_next_keepalive_close_time", 0.0)
    return deadline - handler.keepalive_timeout


class ConnectionGate:
    """The protocol factory of the door's listening socket."""

    def __init__(
        self,
        handlers: Callable[[], RequestHandler],
        limits: ConnectionLimits,
        counted: Callable[[str, RequestError], None] | None = None,
    ) -> None:
        """`counted`: told of each refusal (the front's `refuse`: the refused-requests metric)."""
        self.handlers = handlers
        self.limits = limits
        self.counted = counted
        self.open: dict[_Gated, None] = {}
        self.peers: dict[str, int] = {}
        self.refused = 0
        self.reaped = 0
        self.lingering = 0
        self._scanned = -SCAN_INTERVAL
        self._warned = -WARN_INTERVAL

    def __call__(self) -> asyncio.Protocol:
        return _Gated(self)

    @property
    def pressure_mark(self) -> int:
        return int(self.limits.max_connections * PRESSURE)

    def admit(self, gated: _Gated) -> str | None:
        """None: admitted; else why not."""
        limits, peer = self.limits, gated.peer
        if limits.max_per_peer and self.peers.get(peer, 0) >= limits.max_per_peer:
            # Only that address's own idle connections make room for it.
            self.reap(peer)
            if self.peers.get(peer, 0) >= limits.max_per_peer:
                return self._refuse(f"{limits.max_per_peer} connections from one address", PER_PEER)
        if limits.max_connections:
            if len(self.open) >= self.pressure_mark:
                self.reap()
            if len(self.open) >= limits.max_connections:
                return self._refuse(f"{limits.max_connections} open connections", DOOR)
        self.open[gated] = None
        self.peers[peer] = self.peers.get(peer, 0) + 1
        return None

    def release(self, gated: _Gated) -> None:
        if gated in self.open:
            del self.open[gated]
            left = self.peers[gated.peer] - 1
            if left:
                self.peers[gated.peer] = left
            else:
                del self.peers[gated.peer]

    def reap(self, peer: str | None = None) -> int:
        """Close the connections (of `peer` only, if given) waiting for a request longer than
        `pressure_idle`; how many."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now - self._scanned < SCAN_INTERVAL:
            return 0
        self._scanned = now
        closed = 0
        for gated in list(self.open):
            handler = gated.inner
            if handler is None or (peer is not None and gated.peer != peer):
                continue
            since = waiting_since(handler)
            if since is not None and now - since >= self.limits.pressure_idle:
                # As aiohttp closes a kept-alive connection at its timeout (`close()` would leave
                # an idle one open).
                handler.force_close()
                # Its room is free now: the transport reports the loss only on a later turn.
                self.release(gated)
                closed += 1
        self.reaped += closed
        if closed:
            log.info("HTTP door crowded (%d open): closed %d idle connections", len(self.open), closed)
        return closed

    @property
    def most_lingering(self) -> int:
        """Refused connections that may linger at once: a share of the door's own room, as each
        holds a descriptor."""
        door = self.limits.max_connections or MOST_LINGERING * 16
        return min(MOST_LINGERING, max(1, door // 16))

    def _refuse(self, why: str, bound: tuple[str, str]) -> str:
        setting, reason = bound
        self.refused += 1
        if self.counted is not None:
            self.counted(METHOD, RequestError(grpc.StatusCode.UNAVAILABLE, why, reason=reason))
        now = time.monotonic()
        if now - self._warned >= WARN_INTERVAL:
            self._warned = now
            log.warning(
                "HTTP door refusing new connections past %s (%s; %d refused so far)", why, setting, self.refused
            )
        return why


class _Gated(asyncio.Protocol):
    """One accepted connection: aiohttp's handler behind the gate, or a refusal."""

    __slots__ = ("gate", "inner", "peer", "timer", "transport")

    def __init__(self, gate: ConnectionGate) -> None:
        self.gate = gate
        self.inner: RequestHandler | None = None
        self.peer = ""
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        self.peer = _host(transport.get_extra_info("peername"))
        refusal = self.gate.admit(self)
        if refusal is None:
            self.inner = self.gate.handlers()
            self.inner.connection_made(transport)
        else:
            self._refuse(transport, refusal)

    def _refuse(self, transport: asyncio.Transport, why: str) -> None:
        gate = self.gate
        transport.write(refusal_bytes(why, gate.limits.retry_after))
        if gate.lingering >= gate.most_lingering or not transport.can_write_eof():
            transport.close()
            return
        # Half-closed: the client reads the 503 and its end; what it still sends is read and
        # dropped until it closes, so the close does not reset the connection under the 503.
        transport.write_eof()
        gate.lingering += 1
        self.timer = asyncio.get_running_loop().call_later(LINGER, transport.close)

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        # aiohttp's handler keeps the connection open to answer; a refused one closes it.
        if self.inner is not None:
            self.inner.eof_received()
            return None
        return False

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.inner is not None:
            self.gate.release(self)
            self.inner.connection_lost(exc)
            self.inner = None
        elif self.timer is not None:
            self.timer.cancel()
            self.timer = None
            self.gate.lingering -= 1


def refusal_bytes(why: str, retry_after: int) -> bytes:
    """A complete HTTP/1.1 503 with the spec's error object, written before any request is read."""
    body = json.dumps(plain_error(503, "too_many_connections", f"the door holds {why}; retry later")).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        f"Retry-After: {retry_after}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


def _host(peername: Any) -> str:
    return str(peername[0]) if isinstance(peername, tuple) and peername else ""


class GatedSite(web.BaseSite):
    """aiohttp's TCP site with the gate as its protocol factory."""

    def __init__(
        self,
        runner: web.BaseRunner,
        gate: ConnectionGate,
        host: str,
        port: int,
        *,
        ssl_context: Any = None,
        backlog: int = 128,
        reuse_port: bool | None = None,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self.gate = gate
        self.host, self.port, self.reuse_port = host, port, reuse_port

    @property
    def name(self) -> str:
        return f"{'https' if self._ssl_context else 'http'}://{self.host}:{self.port}"

    async def start(self) -> None:
        await super().start()
        self._server = await asyncio.get_running_loop().create_server(
            self.gate, self.host, self.port, ssl=self._ssl_context, backlog=self._backlog, reuse_port=self.reuse_port
        )
