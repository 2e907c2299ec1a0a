"""A gateway process for the benchmarks: `python -m bench.gateway --provider …`.

The same server `antwort-grpc serve` runs (`start_gateway`, memory store), with the parts a
benchmark needs that `serve` does not offer: an instant in-process model, and in-process
server-side tools. Prints `READY <port>` once it serves; SIGTERM stops it.

providers:
  instant  answers every turn at once with --deltas text deltas of --text
  tools    asks for --calls calls of the tool `sleep` at once, answers after their results
  openai   the OpenAI-compatible provider against --backend-url (the production path)

With --http-listen HOST:PORT the HTTP/SSE door serves the same core there.

tools (server-side, in this process): `sleep` waits --tool-seconds, `noop` returns at once.
With --remote-executor TARGET, the tools run in that ToolExecutorService instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator

from antwort_grpc import event_loop, pb
from antwort_grpc.config import GatewaySettings
from antwort_grpc.executors.base import FunctionExecutor, ProgressSink, ToolExecutor
from antwort_grpc.gateway import start_gateway, tune_gc
from antwort_grpc.ids import new_id
from antwort_grpc.providers.base import (
    Completion,
    FinishReason,
    Provider,
    ProviderEvent,
    TextDelta,
    ToolCallDelta,
    TurnEnd,
    TurnRequest,
)
from antwort_grpc.storage.memory import MemoryStore
from bench.procs import until_stopped


def _answer(text: str) -> Completion:
    part = pb.ContentPart(output_text=pb.OutputText(text=text))
    return Completion([pb.Item(message=pb.Message(role=pb.Role.ROLE_ASSISTANT, content=[part]))])


class InstantProvider:
    """A model with no latency: `deltas` text deltas, then the end of the turn."""

    def __init__(self, deltas: int, text: str) -> None:
        self.deltas = deltas
        self.text = text

    async def stream(self, turn: TurnRequest) -> AsyncIterator[ProviderEvent]:
        delta = TextDelta(self.text)
        for _ in range(self.deltas):
            yield delta
        yield TurnEnd(FinishReason.STOP, pb.Usage(input_tokens=1, output_tokens=self.deltas))

    async def complete(self, turn: TurnRequest) -> Completion:
        return _answer(self.text * self.deltas)


class ToolsProvider:
    """A model with no latency that calls `calls` tools at once, then answers."""

    def __init__(self, calls: int) -> None:
        self.calls = calls

    async def stream(self, turn: TurnRequest) -> AsyncIterator[ProviderEvent]:
        if any(item.WhichOneof("kind") == "function_call_output" for item in turn.items):
            yield TextDelta("done")
            yield TurnEnd(FinishReason.STOP)
            return
        for n in range(self.calls):
            yield ToolCallDelta(n, f'{{"n": {n}}}', call_id=new_id("call"), name="sleep")
        yield TurnEnd(FinishReason.TOOL_CALLS)

    async def complete(self, turn: TurnRequest) -> Completion:
        raise NotImplementedError("the tools model only streams")


class BenchTools:
    """Server-side function tools: `sleep` waits `seconds`, `noop` returns at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    @property
    def kind(self) -> int:
        return pb.ToolKind.TOOL_KIND_SANDBOX

    async def can_execute(self, tool: pb.Tool) -> bool:
        return tool.WhichOneof("kind") == "function" and tool.function.name in ("sleep", "noop")

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: ProgressSink) -> pb.FunctionCallOutput:
        if call.name == "sleep":
            await asyncio.sleep(self.seconds)
        return pb.FunctionCallOutput(call_id=call.call_id, output='{"ok": true}')


def _provider(args: argparse.Namespace) -> Provider:
    if args.provider == "instant":
        return InstantProvider(args.deltas, args.text)
    if args.provider == "tools":
        return ToolsProvider(args.calls)
    from antwort_grpc.providers.openai.config import BackendConfig
    from antwort_grpc.providers.openai.provider import OpenAICompatProvider

    return OpenAICompatProvider(BackendConfig(base_url=args.backend_url, model="bench"))


async def _executors(args: argparse.Namespace) -> list[ToolExecutor]:
    executors: list[ToolExecutor] = [FunctionExecutor()]
    if args.remote_executor:
        from antwort_grpc.executors.remote import RemoteExecutor

        remote = RemoteExecutor(args.remote_executor)
        await remote.start()
        executors.append(remote)
    else:
        executors.append(BenchTools(args.tool_seconds))
    return executors


def _observed(args: argparse.Namespace) -> dict[str, object]:
    """Settings for the observability figure: metrics, traces to an OTLP receiver, JWT auth."""
    more: dict[str, object] = {}
    if args.metrics:
        more["metrics_listen"] = "127.0.0.1:0"
    if args.otlp_endpoint:
        # Read by the OpenTelemetry SDK when the gateway starts, as in a deployment.
        os.environ.update(OTEL_EXPORTER_OTLP_ENDPOINT=args.otlp_endpoint, OTEL_EXPORTER_OTLP_INSECURE="true")
        if args.trace_ratio < 1:
            # The sampling docs/observability.md recommends: a root trace in `ratio` is recorded,
            # a call that comes with its caller's trace follows the caller's decision.
            os.environ.update(
                OTEL_TRACES_SAMPLER="parentbased_traceidratio", OTEL_TRACES_SAMPLER_ARG=str(args.trace_ratio)
            )
    if args.jwt_jwks:
        more.update(auth="jwt", jwt_jwks=args.jwt_jwks, jwt_issuer="bench", jwt_audience="bench")
    return more


async def _serve(args: argparse.Namespace) -> None:
    provider = _provider(args)
    more = _observed(args)
    if args.max_running is not None:
        more["max_running_responses"] = args.max_running
    if args.admission_max_lag is not None:
        more["admission_max_lag"] = args.admission_max_lag
    settings = GatewaySettings(listen="127.0.0.1:0", model="bench", max_turns=50, hooks=args.hook, **more)
    executors = await _executors(args)
    gateway = await start_gateway(settings, provider=provider, store=MemoryStore(), executors=executors)
    door = None
    if args.http_listen:
        from antwort_grpc.http.door import HttpDoor

        door = HttpDoor(gateway.core.front)
        await door.start(args.http_listen)
    if not args.default_gc:
        tune_gc()  # as `antwort-grpc serve` does
    print(f"READY {gateway.port}", flush=True)
    try:
        await until_stopped()
    finally:
        await gateway.stop(0)
        if door is not None:
            await door.stop()
        for part in (provider, *executors):
            close = getattr(part, "aclose", None) or getattr(part, "close", None)
            if close is not None:
                await close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--provider", choices=["instant", "tools", "openai"], required=True)
    parser.add_argument("--backend-url", default="")
    parser.add_argument("--deltas", type=int, default=1000)
    parser.add_argument("--text", default="token ")
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--tool-seconds", type=float, default=0.2)
    parser.add_argument("--remote-executor", default="")
    parser.add_argument("--hook", action="append", default=[], help="a HookService target (bench.hook)")
    parser.add_argument("--metrics", action="store_true", help="Prometheus metrics on (a port of their own)")
    parser.add_argument("--otlp-endpoint", default="", help="traces on, exported to this OTLP/gRPC receiver")
    parser.add_argument("--trace-ratio", type=float, default=1.0, help="traces: parent-based, this ratio of roots")
    parser.add_argument("--jwt-jwks", default="", help="JWT authentication with the keys of this JWKS file")
    parser.add_argument("--http-listen", default="", help="also serve the Open Responses HTTP door there")
    parser.add_argument(
        "--max-running", type=int, default=None, help="ANTWORT_MAX_RUNNING_RESPONSES (the overload figure)"
    )
    parser.add_argument(
        "--admission-max-lag", type=float, default=None, help="ANTWORT_ADMISSION_MAX_LAG (0: no lag bound)"
    )
    parser.add_argument("--default-gc", action="store_true", help="leave CPython's garbage collection as it is")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s gateway %(name)s: %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        event_loop.run(_serve(args))


if __name__ == "__main__":
    main()
