"""The ports every worker binds too, reserved by the parent.

Each port is first bound plainly (so one another process holds is refused, as with one process),
then held by a socket with SO_REUSEPORT that never listens: it receives no connection, but keeps
the port while a worker restarts and makes port 0 one port for all the workers."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from antwort_grpc.startup_errors import StartupError


@dataclass
class Reserved:
    # host:port with the port filled in, as the workers are told to listen.
    listen: str
    port: int
    held: socket.socket

    def close(self) -> None:
        self.held.close()


def reserve(listen: str, setting: str) -> Reserved:
    """The port of `listen` reserved for the workers; StartupError naming `setting` when it cannot be."""
    host, _, port_text = listen.rpartition(":")
    if not port_text.isdigit():
        raise StartupError(f"{setting}: {listen!r} is not host:port")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]") or "0.0.0.0", int(port_text), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
            port = int(probe.getsockname()[1])
        held = socket.socket(family, kind, proto)
        try:
            held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            held.bind((address[0], port, *address[2:]))
        except OSError:
            held.close()
            raise
    except OSError as error:
        raise StartupError(
            f"cannot listen on {listen} ({error.strerror or error}): choose another address with {setting}"
        ) from error
    return Reserved(f"{host}:{port}", port, held)
