"""A HookService subscribed to every point that changes nothing, `python -m bench.hook`: the
cost of hooks themselves (a gRPC round trip per point), not of any policy. Prints `READY <port>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from antwort_grpc import pb
from antwort_grpc.hooks import PolicyHook
from antwort_grpc.hooks.server import serve_hook
from bench.procs import until_stopped


class EveryPoint(PolicyHook):
    name = "bench-every-point"

    async def before_response(self, request: pb.BeforeResponseRequest) -> pb.BeforeResponseResponse:
        return pb.BeforeResponseResponse()

    async def after_response(self, request: pb.AfterResponseRequest) -> pb.AfterResponseResponse:
        return pb.AfterResponseResponse()

    async def before_model(self, request: pb.BeforeModelRequest) -> pb.BeforeModelResponse:
        return pb.BeforeModelResponse()

    async def after_model(self, request: pb.AfterModelRequest) -> pb.AfterModelResponse:
        return pb.AfterModelResponse()

    async def before_tool(self, request: pb.BeforeToolRequest) -> pb.BeforeToolResponse:
        return pb.BeforeToolResponse()

    async def after_tool(self, request: pb.AfterToolRequest) -> pb.AfterToolResponse:
        return pb.AfterToolResponse()

    async def approve_tool(self, request: pb.ApproveToolRequest) -> pb.ApproveToolResponse:
        return pb.ApproveToolResponse()

    async def pause_check(self, request: pb.PauseCheckRequest) -> pb.PauseCheckResponse:
        return pb.PauseCheckResponse()


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
        asyncio.run(_serve())


if __name__ == "__main__":
    main()
