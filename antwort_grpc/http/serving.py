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
    return settings.part(
        DoorSettings,
        "http_",
        keep=("pressure_idle_timeout",),
        # TLS as the gRPC port's; the port shared with the other workers.
        tls_cert=settings.tls_cert,
        tls_key=settings.tls_key,
        tls_client_ca=settings.tls_client_ca,
        reuse_port=settings.worker is not None,
    )


async def open_door(
    settings: GatewaySettings, front: Front, accepting: Callable[[], bool] | None = None
) -> HttpDoor | None:
    """The door serving on `settings.http_listen`; None when it is off.

    An address that was set must bind (StartupError). Left at its default, the address is a
    convenience (the OpenAI SDK works with nothing configured), and a second gateway on the
    machine must still start (the test suite's gateways leave it at its default while `make
    run` holds it): a taken default port moves the door to a free port of the same host, with a
    loud line saying that the default address answers for another process and which one answers
    for this gateway. Off instead, a newcomer's curl to the default address would be answered by
    that other process, with nothing said here about where this gateway listens."""
    listen = settings.http_listen.strip()
    if listen.lower() in OFF:
        return None
    door = HttpDoor(front, door_settings(settings), accepting)
    try:
        await door.start(listen)
    except OSError as error:
        if "http_listen" in settings.model_fields_set:
            raise bind_error(listen, SETTING) from error
        host = listen.rpartition(":")[0] or "127.0.0.1"
        await door.start(f"{host}:0")
        log.warning(
            "HTTP DOOR MOVED: %s is taken (%s) and answers for another process, not this gateway; "
            "this gateway's Open Responses door is %s (set %s to choose, off for none)",
            listen, error.strerror, door.url, SETTING,
        )  # fmt: skip
        return door
    log.info("Open Responses HTTP door listening on %s", door.url)
    return door
