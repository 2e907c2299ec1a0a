"""The benchmark's tools as a real ToolExecutorService (the SDK), `python -m bench.executor`.

The same tools as the gateway's in-process ones: `sleep` waits --tool-seconds, `noop` returns at
once. Prints `READY <port>`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging

from antwort_grpc import event_loop, pb
from antwort_grpc.executors.base import ProgressSink
from antwort_grpc.tool_services.sdk import ExecutorService, function_tool, serve_executor, text_result
from bench.procs import until_stopped

_EMPTY = {"type": "object", "properties": {}}


class BenchToolsService(ExecutorService):
    name = "bench-tools"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def list_tools(self) -> list[pb.ExecutorTool]:
        return [function_tool("sleep", "waits a while", _EMPTY), function_tool("noop", "does nothing", _EMPTY)]

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: ProgressSink) -> pb.FunctionCallOutput:
        if call.name == "sleep":
            await asyncio.sleep(self.seconds)
        return text_result('{"ok": true}')


async def _serve(seconds: float) -> None:
    running = await serve_executor(BenchToolsService(seconds))
    print(f"READY {running.port}", flush=True)
    try:
        await until_stopped()
    finally:
        await running.stop(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--tool-seconds", type=float, default=0.2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        event_loop.run(_serve(args.tool_seconds))


if __name__ == "__main__":
    main()
