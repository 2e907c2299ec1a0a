"""One way to serve gRPC: a grpc.aio server with the health service and reflection, listening on
one address (plaintext or TLS). The gateway, hook services and tool executors all start theirs
here, so message limits, health and reflection behave the same in every program."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

SERVING = health_pb2.HealthCheckResponse.SERVING
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
# The most one message may hold, either way (a request with its tools and history, a call's code).
DEFAULT_MAX_MESSAGE_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """What a program serves and how."""

    # The full names of the services `add_services` adds (reported SERVING once started).
    services: Sequence[str]
    add_services: Callable[[grpc.aio.Server], None]
    credentials: grpc.ServerCredentials | None = None
    interceptors: Sequence[grpc.aio.ServerInterceptor] = ()
    # More channel arguments (keepalive, connection age).
    options: Sequence[tuple[str, int | str]] = ()
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    reflection: bool = True


@dataclass
class Serving:
    server: grpc.aio.Server
    port: int
    host: str
    health: HealthServicer

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    async def stop(self, grace: float | None) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


async def start_server(listen: str, spec: ServerSpec) -> Serving:
    """Start serving on `listen` (port 0 picks a free one); OSError when it cannot listen."""
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", spec.max_message_bytes),
            ("grpc.max_send_message_length", spec.max_message_bytes),
            *spec.options,
        ],
        interceptors=list(spec.interceptors),
    )
    spec.add_services(server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    if spec.reflection:
        reflection.enable_server_reflection([*spec.services, HEALTH_SERVICE, reflection.SERVICE_NAME], server)
    if spec.credentials is None:
        port = server.add_insecure_port(listen)
    else:
        port = server.add_secure_port(listen, spec.credentials)
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    await server.start()
    await health.set("", SERVING)
    for name in spec.services:
        await health.set(name, SERVING)
    return Serving(server, port, host_of(listen), health)


def bound_address(listen: str, port: int) -> str:
    """The address a server listens on, its port filled in: for the log (0.0.0.0 stays 0.0.0.0,
    every interface), where `Serving.target` is where a client on this machine reaches it."""
    return f"{listen.rsplit(':', 1)[0]}:{port}"


def host_of(listen: str) -> str:
    """The host a client on this machine reaches a listen address at."""
    host = listen.rsplit(":", 1)[0]
    return "127.0.0.1" if host in ("", "0.0.0.0", "[::]") else host
