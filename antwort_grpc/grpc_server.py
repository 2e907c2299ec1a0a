"""One way to serve gRPC: a grpc.aio server with the health service and reflection, listening on
one address (plaintext or TLS). The gateway, hook services and tool executors all start theirs
here, so message limits, health and reflection behave the same in every program.

Health answers Check, Watch and List. Reflection is served as `grpc.reflection.v1` (what current
grpcurl, grpc-go and grpc-java ask first) and `grpc.reflection.v1alpha` (what older clients ask):
grpcio-reflection implements v1alpha only, and v1 is the same protocol under another package name
(the same messages, field for field), so its servicer answers both.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha._async import ReflectionServicer

from antwort_grpc.grpc_accept import aio_server

SERVING = health_pb2.HealthCheckResponse.SERVING
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
REFLECTION_V1ALPHA = reflection.SERVICE_NAME
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
_V1_FILE = "grpc/reflection/v1/reflection.proto"
# The most one message may hold, either way (a request with its tools and history, a call's code).
DEFAULT_MAX_MESSAGE_BYTES = 32 * 1024 * 1024
# Calls of a method that reached grpc and wait for the server to take them in. grpc's own bound
# (1,000, past which it drops a growing share of new calls, all of them at 3,000) ends a burst's
# calls CANCELLED before the server sees them: no message, no log line, no metric, and never
# admission's refusal with its pushback. Up to this many wait (about 12 KiB each, and what the
# client sent of its request) and are taken in, admitted or refused; past it grpc still drops,
# as it does a call that waited 30 s (`grpc.server_max_unrequested_time_in_server`).
MAX_WAITING_CALLS = 10_000


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
    # What every service is added through (the per-RPC metrics wrap each method's handler there);
    # None: the server itself.
    adding: Callable[[grpc.aio.Server], grpc.aio.Server] | None = None
    # Share the port with other processes that set it too (the workers of `serve --workers N`);
    # otherwise a port another process listens on is refused, whatever grpcio's default.
    reuse_port: bool = False


class Health(HealthServicer):  # type: ignore[misc]
    """grpcio-health-checking's servicer (its async one answers List UNIMPLEMENTED), with List."""

    async def List(self, request: health_pb2.HealthListRequest, context: Any) -> health_pb2.HealthListResponse:
        # The statuses the servicer keeps (grpcio-health-checking is pinned: its attribute is known).
        statuses = dict(self._server_status)
        return health_pb2.HealthListResponse(
            statuses={name: health_pb2.HealthCheckResponse(status=status) for name, status in statuses.items()}
        )


def _add_reflection_v1_file(pool: Any) -> None:
    """grpc.reflection.v1's file in `pool` (so reflection describes it too): v1alpha's, renamed."""
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    old, new = f".{proto.package}.", ".grpc.reflection.v1."
    proto.name, proto.package = _V1_FILE, "grpc.reflection.v1"
    proto.options.java_package = "io.grpc.reflection.v1"
    proto.options.go_package = "google.golang.org/grpc/reflection/grpc_reflection_v1"
    for message in proto.message_type:
        for field in message.field:
            if field.HasField("type_name"):
                field.type_name = field.type_name.replace(old, new, 1)
    for service in proto.service:
        for method in service.method:
            method.input_type = method.input_type.replace(old, new, 1)
            method.output_type = method.output_type.replace(old, new, 1)
    pool.Add(proto)


def enable_reflection(service_names: Sequence[str], server: grpc.aio.Server) -> None:
    """Reflection v1 and v1alpha, listing `service_names` and themselves."""
    pool = descriptor_pool.Default()
    _add_reflection_v1_file(pool)
    servicer = ReflectionServicer([*service_names, REFLECTION_V1, REFLECTION_V1ALPHA], pool=pool)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    # v1's messages are v1alpha's on the wire: the same (de)serializers serve it.
    info = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(REFLECTION_V1, {"ServerReflectionInfo": info}),)
    )


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
    server = aio_server(
        options=[
            ("grpc.so_reuseport", 1 if spec.reuse_port else 0),
            ("grpc.max_receive_message_length", spec.max_message_bytes),
            ("grpc.max_send_message_length", spec.max_message_bytes),
            # The same soft and hard limit: none dropped below it, every one past it.
            ("grpc.server.max_pending_requests", MAX_WAITING_CALLS),
            ("grpc.server.max_pending_requests_hard_limit", MAX_WAITING_CALLS),
            *spec.options,
        ],
        interceptors=spec.interceptors,
    )
    adding = spec.adding(server) if spec.adding is not None else server
    spec.add_services(adding)
    health = Health()
    health_pb2_grpc.add_HealthServicer_to_server(health, adding)
    if spec.reflection:
        enable_reflection([*spec.services, HEALTH_SERVICE], adding)
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


class Served(Protocol):
    """What a program serves (a policy hook, a tool executor service): started before its server,
    closed after it."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...


@dataclass
class ProgramServing(Serving):
    """The server of a program that serves one thing: stopping it also closes that thing."""

    serves: Served

    async def stop(self, grace: float | None = 5.0) -> None:
        await super().stop(grace)
        await self.serves.close()


async def start_program(listen: str, spec: ServerSpec, serves: Served) -> ProgramServing:
    """Start `serves`, then its server on `listen`; `serves` closed again when the server cannot
    start (OSError when it cannot listen)."""
    await serves.start()
    try:
        serving = await start_server(listen, spec)
    except BaseException:
        await serves.close()
        raise
    return ProgramServing(serving.server, serving.port, serving.host, serving.health, serves)


async def serve_until_signalled(serving: Serving, name: str, grace: float) -> None:
    """A program's serving: say where `name` serves, serve until SIGTERM or SIGINT, then stop it
    gracefully (`serving.stop`, which a program's own Serving extends to close what it serves)."""
    print(f"{name} serving on {serving.target}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await serving.stop(grace)
