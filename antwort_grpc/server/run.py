"""`antwort-grpc serve`: assemble the parts, serve until SIGTERM, shut down gracefully."""

from __future__ import annotations

import logging

from antwort_grpc.config import GatewaySettings
from antwort_grpc.server.app import serve_until_signalled, start_gateway
from antwort_grpc.server.assemble import assemble

log = logging.getLogger(__name__)


async def serve(settings: GatewaySettings) -> None:
    parts = await assemble(settings)
    try:
        gateway = await start_gateway(settings, provider=parts.provider, store=parts.store, executors=parts.executors)
        print(f"antwort-grpc serving on {gateway.target}", flush=True)
        await serve_until_signalled(gateway, settings.shutdown_grace, settings.shutdown_drain)
    finally:
        await parts.close()
