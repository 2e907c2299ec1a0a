"""`antwort-grpc serve`: assemble the parts, serve until SIGTERM, shut down gracefully."""

from __future__ import annotations

import gc
import logging

from antwort_grpc import tracing
from antwort_grpc.auth.build import refuse_open_listen
from antwort_grpc.config import GatewaySettings
from antwort_grpc.core import assemble
from antwort_grpc.http.serving import open_door
from antwort_grpc.observability.logs import one_line
from antwort_grpc.server.app import serve_until_signalled, start_gateway

log = logging.getLogger(__name__)


# Young-generation collections every this many allocations (CPython's default: 700).
GC_YOUNG_THRESHOLD = 10_000


def tune_gc() -> None:
    """Garbage collection for a process that holds many streams: start-up objects are frozen
    (never walked again) and collections run far less often.

    Every streamed event allocates a few container objects; with the defaults, a gateway holding
    1,000 streams spent about 4 % of its time collecting, with pauses up to 100 ms that every
    stream's next token waited out (bench/RESULTS.md). Reference counting still frees nearly
    everything at once; only cyclic garbage waits longer."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


async def serve(settings: GatewaySettings) -> None:
    # Before anything starts: a refusal must not leave a local model or a store half opened.
    refuse_open_listen(settings)
    parts = await assemble(settings)
    try:
        gateway = await start_gateway(settings, provider=parts.provider, store=parts.store, executors=parts.executors)
        try:
            door = await open_door(settings, gateway.core, gateway.accepting)
        except BaseException:
            await gateway.stop(0)
            raise
        tune_gc()
        # The line scripts wait for; in the log format, so stdout too is JSON with --log-format json.
        line = one_line(f"antwort-grpc serving on {gateway.target}", settings.log_format, target=gateway.target)
        print(line, flush=True)
        try:
            await serve_until_signalled(
                gateway, settings.shutdown_grace, settings.shutdown_drain, settings.interrupt_grace
            )
        finally:
            # After the gateway's shutdown: the door's streams got the same grace and their
            # terminal events.
            if door is not None:
                await door.stop()
    finally:
        await parts.close()
        # Export the spans still buffered.
        tracing.shutdown()
