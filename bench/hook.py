"""A HookService subscribed to every point that changes nothing, `python -m bench.hook`: the
cost of hooks themselves (the gateway's exchanges with it over its Session stream), not of any
policy. Prints `READY <port>`.
"""

from __future__ import annotations

import contextlib
import logging

from antwort_grpc import event_loop
from antwort_grpc.hooks import PolicyHook
from antwort_grpc.hooks.server import serve_hook
from antwort_grpc.hooks.service import POINTS
from bench.procs import until_stopped


class EveryPoint(PolicyHook):
    """Subscribed to every point; PolicyHook's defaults answer each with an empty reply."""

    name = "bench-every-point"

    def points(self) -> frozenset[int]:
        return frozenset(POINTS)


async def _serve() -> None:
    running = await serve_hook(EveryPoint())
    print(f"READY {running.port}", flush=True)
    try:
        await until_stopped()
    finally:
        await running.stop(0)


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        event_loop.run(_serve())


if __name__ == "__main__":
    main()
