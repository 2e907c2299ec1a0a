"""How the gateway treats its HTTP/2 connections: which client pings it accepts, how it finds dead
clients, and when it asks a client to reconnect so long-lived connections spread over replicas.

grpcio's defaults suit none of that: a client may ping at most every 5 minutes and never without
a call (two pings too early and the connection is closed with `too_many_pings`, taking an idle
Converse stream with it), the server pings only after 2 hours, and a connection lives forever, so
an L4 balancer that placed it once never moves it.
"""

from __future__ import annotations

from antwort_grpc.config import GatewaySettings
from antwort_grpc.open_files import door_bounds


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def connection_options(settings: GatewaySettings) -> list[tuple[str, int]]:
    """The grpc.aio server options for the gateway's port."""
    options = [
        # Accept client keepalive pings this far apart, with or without calls in flight.
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", _ms(settings.keepalive_min_ping_interval)),
        # The server's own pings: a peer that stops answering is closed, its streams ended.
        ("grpc.keepalive_time_ms", _ms(settings.keepalive_time)),
        ("grpc.keepalive_timeout_ms", _ms(settings.keepalive_timeout)),
        # Keep pinging a connection whose only stream is idle (an approval that takes its time).
        ("grpc.http2.max_pings_without_data", 0),
        # Any ping left unanswered that long closes the connection. Without it an unanswered
        # flow-control ping holds back the keepalive ping (one ping in flight at a time): a client
        # gone silent was still holding its stream a minute later.
        ("grpc.http2.ping_timeout_ms", _ms(settings.keepalive_timeout)),
    ]
    if settings.max_connection_age > 0:
        options.append(("grpc.max_connection_age_ms", _ms(settings.max_connection_age)))
        # Unset: grpcio's default, no limit; a GOAWAY only steers new calls elsewhere.
        if settings.max_connection_age_grace is not None:
            options.append(("grpc.max_connection_age_grace_ms", _ms(settings.max_connection_age_grace)))
    # Connections past it are closed as they are accepted (grpc's connection quota, per server):
    # descriptors stay for the HTTP door, the store and the backend.
    most = door_bounds().grpc if settings.max_connections is None else settings.max_connections
    if most > 0:
        options.append(("grpc.max_allowed_incoming_connections", most))
    if settings.max_streams_per_connection > 0:
        options.append(("grpc.max_concurrent_streams", settings.max_streams_per_connection))
    return options
