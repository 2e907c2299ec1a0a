"""The HTTP door as `antwort-grpc serve` opens it: on `http_listen` (ANTWORT_HTTP_LISTEN), with
the gRPC port's TLS files."""

from __future__ import annotations

import logging
from collections.abc import Callable

from antwort_grpc.config import GatewaySettings
from antwort_grpc.front import Front
from antwort_grpc.http.door import DoorSettings, HttpDoor
from antwort_grpc.startup_errors import bind_error

log = logging.getLogger(__name__)

OFF = ("", "off")
SETTING = "--http-listen / ANTWORT_HTTP_LISTEN"


def door_settings(settings: GatewaySettings) -> DoorSettings:
    return DoorSettings(
        max_body_bytes=settings.http_max_body_bytes,
        idle_timeout=settings.http_idle_timeout,
        tls_cert=settings.tls_cert,
        tls_key=settings.tls_key,
        tls_client_ca=settings.tls_client_ca,
    )


async def open_door(
    settings: GatewaySettings, front: Front, accepting: Callable[[], bool] | None = None
) -> HttpDoor | None:
    """The door serving on `settings.http_listen`; None when it is off.

    Left at its default the address is a convenience (the OpenAI SDK works with nothing
    configured): a port already taken there turns the door off with a warning, so a second
    gateway on the machine still starts. An address that was set must bind (StartupError)."""
    listen = settings.http_listen.strip()
    if listen.lower() in OFF:
        return None
    door = HttpDoor(front, door_settings(settings), accepting)
    try:
        await door.start(listen)
    except OSError as error:
        if "http_listen" in settings.model_fields_set:
            raise bind_error(listen, SETTING) from error
        log.warning("the HTTP door is off: cannot listen on %s (%s); set %s", listen, error.strerror, SETTING)
        return None
    log.info("Open Responses HTTP door listening on %s", door.url)
    return door
