"""Free loopback ports for processes a test starts (never a fixed one: another gateway may be up
on this machine). Ports asked for one after the other are held until all are chosen: a port bound
and let go at once can be handed out again by the next ask, and two servers of one test then
collide (it happened: a worker's HTTP port was the metrics port picked just before it)."""

from __future__ import annotations

import socket


def free_ports(count: int, avoid: frozenset[int] = frozenset()) -> list[int]:
    """`count` distinct ports free on 127.0.0.1 now, none of them in `avoid`."""
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            sock = socket.socket()
            held.append(sock)  # bound until the end, so the kernel does not offer it twice
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
            if port not in avoid:
                ports.append(port)
        return ports
    finally:
        for sock in held:
            sock.close()
