"""A PolicyHook behind antwort.v1.HookService on a grpc.aio server (health and reflection too):
`antwort-grpc hook run module:Class --listen host:port`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias

import grpc
from google.protobuf.message import Message

from antwort_grpc import pb
from antwort_grpc.grpc_server import ProgramServing, ServerSpec, serve_until_signalled, start_program
from antwort_grpc.hooks.service import MAX_MESSAGE_BYTES, POINT_OF, POINTS, Caller, PolicyHook, current_caller, evaluate

log = logging.getLogger(__name__)

Context: TypeAlias = Any  # grpc ships no type information for the servicer context
SERVICE_NAME = "antwort.v1.HookService"


class HookServicer(pb.HookServiceServicer):
    """antwort.v1.HookService over one PolicyHook: each RPC calls the hook's method of that point.
    A hook that raises fails the RPC with INTERNAL; the gateway applies its failure policy."""

    def __init__(self, hook: PolicyHook) -> None:
        self.hook = hook
        for point, spec in POINTS.items():
            setattr(self, spec.rpc, self._rpc(point))

    async def GetHookInfo(self, request: pb.GetHookInfoRequest, context: Context) -> pb.GetHookInfoResponse:
        points: list[Any] = sorted(self.hook.points())
        return pb.GetHookInfoResponse(name=self.hook.name, points=points, session=True)

    async def Session(self, requests: AsyncIterator[pb.SessionRequest], context: Context) -> None:
        """Every exchange in a task of its own (a slow decision for one response holds up no
        other); answers are written one at a time, as they are ready."""
        writing = asyncio.Lock()
        answering: set[asyncio.Task[None]] = set()

        async def answer(request: pb.SessionRequest) -> None:
            reply = await self._exchange(request)
            async with writing:
                await context.write(reply)

        try:
            async for request in requests:
                task = asyncio.create_task(answer(request))
                answering.add(task)
                task.add_done_callback(answering.discard)
            await asyncio.gather(*answering)
        finally:
            for task in answering:
                task.cancel()

    async def _exchange(self, request: pb.SessionRequest) -> pb.SessionResponse:
        caller = request.caller
        current_caller.set(Caller(caller.owner, caller.traceparent, caller.tracestate))
        reply = pb.SessionResponse(exchange_id=request.exchange_id)
        calls: list[Message] = []
        for call in request.calls:
            which = call.WhichOneof("point")
            if which is None:
                reply.error = "a call names no point"
                return reply
            calls.append(getattr(call, which))
        try:
            # Past the gateway's timeout nobody waits for the answer.
            async with asyncio.timeout(request.timeout.ToNanoseconds() / 1e9 if request.HasField("timeout") else None):
                exchange = await evaluate(self.hook, calls)
        except TimeoutError:
            reply.error = "the gateway's timeout passed"
            return reply
        for asked, answer in zip(calls, exchange.answers, strict=False):
            spec = POINTS[POINT_OF[type(asked)]]
            if not isinstance(answer, spec.reply):
                reply.error = f"{spec.method} answered a {type(answer).__name__}, not a {spec.reply.__name__}"
                return reply
            getattr(reply.answers.add(), spec.method).CopyFrom(answer)
        if exchange.error:
            failed = POINTS[POINT_OF[type(calls[len(exchange.answers)])]].method
            log.warning("hook %s failed at %s: %s", self.hook.name, failed, exchange.error)
            reply.error = exchange.error
        return reply

    def _rpc(self, point: int) -> Callable[[Message, Context], Awaitable[Message]]:
        async def handle(request: Message, context: Context) -> Message:
            current_caller.set(Caller.from_metadata(context.invocation_metadata() or ()))
            try:
                return await self.hook.call(point, request)
            except Exception as err:
                log.exception("hook %s failed at %s", self.hook.name, POINTS[point].method)
                await context.abort(grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {err}")
                raise AssertionError("unreachable") from err

        return handle


async def serve_hook(
    hook: PolicyHook, listen: str = "127.0.0.1:0", servicer: HookServicer | None = None
) -> ProgramServing:
    """Start a grpc.aio server for the hook; port 0 picks a free one (see `.port`). `servicer`:
    a HookServicer (subclass) of `hook` to serve instead of the plain one."""
    spec = ServerSpec(
        services=[SERVICE_NAME],
        add_services=lambda server: pb.add_HookServiceServicer_to_server(servicer or HookServicer(hook), server),
        max_message_bytes=MAX_MESSAGE_BYTES,
    )
    return await start_program(listen, spec, hook)


async def run_hook(hook: PolicyHook, listen: str, grace: float = 5.0) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully."""
    await serve_until_signalled(await serve_hook(hook, listen), f"antwort-grpc hook {hook.name}", grace)
