"""Server-side tools that live in other services: a gRPC client of one ToolExecutorService.

One `RemoteExecutor` per configured target (`ANTWORT_EXECUTORS`). It keeps the service's
GetExecutorInfo (kind, name, tools), fetched at start and refreshed periodically, and answers
`can_execute` and `functions_for` from it; a tool that is not listed is asked about with the
CanExecute RPC, whose answers are cached for a while.

Failure model: a call to a service that is down or too slow becomes an is_error tool result that
goes back to the model, and the service is marked unhealthy; while unhealthy, calls fail at once
instead of waiting, and a background probe asks the service again every second or so. The first
answer marks it healthy again. Nothing waits without a deadline: every RPC has a timeout (a call's
is what remains of the request's deadline, capped by `call_timeout`), and no RPC waits for a
channel that is not ready. The gateway starts even when a service is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from antwort_grpc import pb
from antwort_grpc.executors.base import ProgressSink, current_deadline
from antwort_grpc.tasks import Started, stop_task
from antwort_grpc.tracing import metadata as trace_metadata

log = logging.getLogger(__name__)

K = pb.ToolKind
# The gateway's health service reports each executor under this prefix plus its target.
HEALTH_PREFIX = "antwort.v1.ToolExecutorService/"

# Channel options: reconnect quickly after a service restarts (the default backoff grows to two
# minutes, during which every call would fail), and spread calls over every address a DNS name
# resolves to (a headless Kubernetes Service of several sandbox pods).
_SERVICE_CONFIG: dict[str, Any] = {"loadBalancingConfig": [{"round_robin": {}}]}
_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.service_config", json.dumps(_SERVICE_CONFIG)),
    ("grpc.enable_retries", 0),
    ("grpc.max_receive_message_length", 32 * 1024 * 1024),
    ("grpc.max_send_message_length", 32 * 1024 * 1024),
]

# Addresses as gRPC's own messages give them ("ipv4:10.0.0.7:50061", "unix:/run/x.sock").
_ADDRESS = re.compile(r"\b(?:ipv4|ipv6|unix|unix-abstract|dns):\S+")

# Status codes that say the service (not the call) is the problem: it is marked unhealthy.
_SERVICE_DOWN = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


@dataclass(frozen=True, slots=True)
class RemoteSettings:
    # Seconds between GetExecutorInfo refreshes while the service is healthy.
    refresh_interval: float = 10.0
    # Seconds between probes while it is unhealthy.
    retry_interval: float = 1.0
    # Timeout of GetExecutorInfo and CanExecute.
    info_timeout: float = 2.0
    # The longest one tool call may take; the request's deadline shortens it.
    call_timeout: float = 300.0
    # Seconds a CanExecute answer is reused, and how many are kept.
    can_execute_ttl: float = 30.0
    can_execute_cache_size: int = 512
    # TLS credentials of the channel (None: plaintext), and the token sent as `authorization:
    # Bearer <token>` on every call (the services' ANTWORT_EXECUTOR_TOKEN).
    credentials: grpc.ChannelCredentials | None = None
    token: str | None = None


class _Catalog:
    """The tools of one GetExecutorInfo answer, indexed the way routing asks about them."""

    def __init__(self, info: pb.GetExecutorInfoResponse) -> None:
        self.info = info
        self.functions = {t.function.name: t.function for t in info.tools if not t.server_label}
        self.by_label: dict[str, list[pb.FunctionTool]] = {}
        for t in info.tools:
            if t.server_label:
                self.by_label.setdefault(t.server_label, []).append(t.function)
        self.labelled = {f.name for functions in self.by_label.values() for f in functions}
        self.timeouts = {
            t.function.name: t.timeout.seconds + t.timeout.nanos / 1e9 for t in info.tools if t.HasField("timeout")
        }
        self.idempotent = {t.function.name for t in info.tools if t.idempotent}


class RemoteExecutor(Started):
    """A ToolExecutor and HostedToolSource backed by one ToolExecutorService target.

    How a request's tool reaches it:
      - a function tool: when the service lists a function of that name (without a server label);
      - an `mcp` tool: when the service lists tools of that server label; the model sees those,
        narrowed to `allowed_tools` when the request gives them;
      - `code_interpreter`: when the service is a SANDBOX; the model sees the functions it lists.
    For anything not listed the service is asked with CanExecute (cached).
    """

    def __init__(self, target: str, settings: RemoteSettings | None = None) -> None:
        self.target = target
        self.settings = settings or RemoteSettings()
        self.health_name = HEALTH_PREFIX + target
        self._auth: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {self.settings.token}"),) if self.settings.token else ()
        )
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None
        self._catalog: _Catalog | None = None
        # None until the service was first asked.
        self._state: bool | None = None
        self._last_error = "not contacted yet"
        self._reported: bool | None = None
        self._health: Any = None  # grpc_health's async HealthServicer, when attached
        self._cache: OrderedDict[bytes, tuple[bool, float]] = OrderedDict()
        self._wake = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect and fetch the service's tools once; a service that is down is logged and
        retried in the background, never an error."""
        if self._channel is None:
            if self.settings.credentials is not None:
                self._channel = grpc.aio.secure_channel(
                    self.target, self.settings.credentials, options=_CHANNEL_OPTIONS
                )
            else:
                self._channel = grpc.aio.insecure_channel(self.target, options=_CHANNEL_OPTIONS)
            self._stub = pb.ToolExecutorServiceStub(self._channel)
        await self.refresh()
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch(), name=f"executor-watch {self.target}")

    async def close(self) -> None:
        await stop_task(self._watcher)
        self._watcher = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def attach_health(self, health: Any) -> None:
        """Report this service's health under `health_name` in the gateway's health service."""
        self._health = health
        self._reported = None
        await self._report()

    # -- what the service is ----------------------------------------------------------------------

    @property
    def kind(self) -> int:
        # A remote service always runs its calls on the server side; one that reports FUNCTION (the
        # engine's kind for client-executed tools) must not have its calls handed to the client.
        kind = self._catalog.info.kind if self._catalog else K.TOOL_KIND_UNSPECIFIED
        server_kinds = (K.TOOL_KIND_MCP, K.TOOL_KIND_SANDBOX, K.TOOL_KIND_CUSTOM)
        return kind if kind in server_kinds else K.TOOL_KIND_UNSPECIFIED

    @property
    def name(self) -> str:
        return (self._catalog.info.name if self._catalog else "") or self.target

    @property
    def healthy(self) -> bool:
        return self._state is True

    def tool_timeout(self, name: str) -> float | None:
        """The default timeout the service advertises for one call of `name`, if any."""
        return self._catalog.timeouts.get(name) if self._catalog else None

    def is_idempotent(self, name: str) -> bool:
        """Whether the service declares that running a call of `name` twice does no harm."""
        return self._catalog is not None and name in self._catalog.idempotent

    @property
    def tools(self) -> list[pb.ExecutorTool]:
        """The tools the service listed last (kept while it is down)."""
        return list(self._catalog.info.tools) if self._catalog else []

    # -- routing ----------------------------------------------------------------------------------

    async def can_execute(self, tool: pb.Tool) -> bool:
        catalog = self._catalog
        kind = tool.WhichOneof("kind")
        if catalog is not None:
            if kind == "function" and tool.function.name in catalog.functions:
                return True
            if kind == "function" and tool.function.name in catalog.labelled:
                # A tool of an MCP server is reached through its server label (a request names
                # the server), never as a bare function that happens to share its name.
                return False
            if kind == "mcp" and tool.mcp.server_label in catalog.by_label:
                return True
            if kind == "code_interpreter" and catalog.info.kind == K.TOOL_KIND_SANDBOX:
                return True
        return await self._ask_can_execute(tool)

    async def functions_for(self, tool: pb.Tool) -> list[pb.FunctionTool]:
        catalog = self._catalog
        if catalog is None:
            return []
        kind = tool.WhichOneof("kind")
        if kind == "mcp":
            functions = catalog.by_label.get(tool.mcp.server_label, [])
            allowed = set(tool.mcp.allowed_tools)
            return [f for f in functions if not allowed or f.name in allowed]
        if kind == "code_interpreter":
            return list(catalog.functions.values())
        return []

    async def _ask_can_execute(self, tool: pb.Tool) -> bool:
        """CanExecute for a tool the service does not list; cached, and not asked while the
        service is unhealthy (a request must not wait on a service that is down)."""
        if self._stub is None or not self.healthy:
            return False
        key = tool.SerializeToString(deterministic=True)
        loop = asyncio.get_running_loop()
        cached = self._cache.get(key)
        if cached is not None and cached[1] > loop.time():
            self._cache.move_to_end(key)
            return cached[0]
        try:
            reply = await self._stub.CanExecute(
                pb.CanExecuteRequest(tool=tool),
                timeout=self.settings.info_timeout,
                wait_for_ready=False,
                metadata=self._auth,
            )
        except grpc.aio.AioRpcError as err:
            await self._failed(err)
            return False
        answer = bool(reply.can_execute)
        self._cache[key] = (answer, loop.time() + self.settings.can_execute_ttl)
        self._cache.move_to_end(key)
        while len(self._cache) > self.settings.can_execute_cache_size:
            self._cache.popitem(last=False)
        if answer and tool.WhichOneof("kind") != "function":
            # A hosted tool the last listing did not show (an MCP server that connected since):
            # list again now, so functions_for offers its functions to this very request.
            await self.refresh()
        return answer

    # -- running a call ---------------------------------------------------------------------------

    async def execute(self, call: pb.FunctionCall, tool: pb.Tool, progress: ProgressSink) -> pb.FunctionCallOutput:
        if self._stub is None:
            return _error(call, f"{self._public} is not started")
        if not self.healthy:
            # What went wrong is in the gateway's log; the model is never told internal addresses.
            return _error(call, f"{self._public} is unavailable, try again later")
        timeout = self.settings.call_timeout
        deadline = current_deadline.get()
        if deadline is not None:
            timeout = min(timeout, deadline - asyncio.get_running_loop().time())
        if timeout <= 0:
            return _error(call, f"the request's deadline passed before tool {call.name!r} could run")
        stream = self._stub.Execute(
            pb.ExecuteRequest(call=call, tool=tool),
            timeout=timeout,
            wait_for_ready=False,
            metadata=(*self._auth, *(trace_metadata() or ())),
        )
        result: pb.FunctionCallOutput | None = None
        try:
            async for update in stream:
                which = update.WhichOneof("update")
                if which == "progress":
                    progress(update.progress.message)
                elif which == "result":
                    result = update.result
        except grpc.aio.AioRpcError as err:
            await self._failed(err)
            return _error(call, self._describe_failure(call, err, timeout))
        finally:
            stream.cancel()
        await self._succeeded()
        if result is None:
            return _error(call, f"{self._public} ended the call of {call.name!r} without a result")
        result.call_id = call.call_id
        return result

    def _describe_failure(self, call: pb.FunctionCall, err: grpc.aio.AioRpcError, timeout: float) -> str:
        """The failure as the model sees it: never the service's address (gRPC's own messages for
        a connection that failed carry it); the gateway's log has the full text."""
        code = err.code()
        where = self._public
        log.warning("tool %r on %s (%s) failed: %s: %s", call.name, self.name, self.target, code.name, err.details())
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return f"tool {call.name!r} did not finish within {timeout:.1f}s on {where}"
        if code == grpc.StatusCode.UNAVAILABLE:
            return f"{where} is unavailable, try again later"
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return f"{where} refused the gateway's credentials"
        details = self._scrub(err.details() or "")
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return f"{where} is busy, try again later: {details}"
        return f"{where} failed the call of {call.name!r}: {code.name}: {details}"

    @property
    def _public(self) -> str:
        """The service as named to the model: its own name, never its target."""
        name = self._catalog.info.name if self._catalog else ""
        return f"tool service {name}" if name else "the tool service"

    def _scrub(self, text: str) -> str:
        return _ADDRESS.sub("<address>", text.replace(self.target, "<address>"))

    # -- health -----------------------------------------------------------------------------------

    async def refresh(self) -> bool:
        """Fetch the service's info now; whether it answered."""
        if self._stub is None:
            return False
        try:
            info = await self._stub.GetExecutorInfo(
                pb.GetExecutorInfoRequest(),
                timeout=self.settings.info_timeout,
                wait_for_ready=False,
                metadata=self._auth,
            )
        except grpc.aio.AioRpcError as err:
            await self._mark(False, f"{err.code().name}: {err.details()}")
            return False
        if self._catalog is None or self._catalog.info != info:
            if self._catalog is not None:
                log.info("tool service %s (%s) changed its tools", info.name, self.target)
            self._catalog = _Catalog(info)
            # A changed tool list may change CanExecute answers too.
            self._cache.clear()
        await self._mark(True)
        return True

    async def _watch(self) -> None:
        while True:
            interval = self.settings.refresh_interval if self.healthy else self.settings.retry_interval
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("refreshing tool service %s failed", self.target)

    async def _failed(self, err: grpc.aio.AioRpcError) -> None:
        if err.code() in _SERVICE_DOWN:
            await self._mark(False, f"{err.code().name}: {err.details()}")
            self._wake.set()

    async def _succeeded(self) -> None:
        if not self.healthy:
            await self._mark(True)

    async def _mark(self, healthy: bool, reason: str = "") -> None:
        """Record the service's state; changes are logged once, not on every probe."""
        if healthy != self._state:
            if healthy:
                log.info("tool service %s (%s) is available", self.name, self.target)
            else:
                log.warning("tool service %s (%s) is unavailable: %s", self.name, self.target, reason)
        self._state = healthy
        if not healthy:
            self._last_error = reason
        await self._report()

    async def _report(self) -> None:
        if self._health is None or self._reported == self.healthy:
            return
        self._reported = self.healthy
        serving = health_pb2.HealthCheckResponse.SERVING
        await self._health.set(
            self.health_name, serving if self.healthy else health_pb2.HealthCheckResponse.NOT_SERVING
        )


def _error(call: pb.FunctionCall, message: str) -> pb.FunctionCallOutput:
    return pb.FunctionCallOutput(call_id=call.call_id, output=message, is_error=True)


def build_executors(targets: Iterable[str], settings: RemoteSettings | None = None) -> list[RemoteExecutor]:
    """One RemoteExecutor per distinct target, in the configured order (the first that claims a
    function tool runs it)."""
    seen: list[str] = []
    for target in targets:
        target = target.strip()
        if target and target not in seen:
            seen.append(target)
    return [RemoteExecutor(target, settings) for target in seen]


async def start_all(executors: Sequence[RemoteExecutor]) -> None:
    """Start every executor at once, so startup waits for the slowest, not for their sum."""
    await asyncio.gather(*(e.start() for e in executors))
