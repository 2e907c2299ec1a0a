"""The bridge's link to one MCP server, kept alive by one owner task.

The SDK's client is a stack of anyio task groups and cancel scopes (transport, session), and
those must be exited by the task that entered them. So one long-lived owner task per server
enters the client, lists the tools, keeps the listing fresh, notices when the connection ends,
exits the client and connects again with backoff. Nothing else enters or exits it.

Calls and on-demand listings run in the callers' own tasks on the owner's live session. The SDK
allows that: a request is a message on a memory stream correlated by id, its caller waits on its
own stream, and a connection that closes answers every waiting request with CONNECTION_CLOSED —
so a caller never hangs on a dead server, and a gRPC deadline or cancellation stays in the
caller's task (the SDK then sends the server a courtesy cancel).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any, Generic, TypeVar

import anyio
import httpx2
from mcp import Client, MCPError, StdioServerParameters
from mcp import types as mt
from mcp.client import IncomingMessage, Transport
from mcp.client._transport import TransportStreams  # the item types of the public Transport protocol
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from antwort_grpc import pb
from antwort_grpc.executors.base import ProgressSink
from antwort_grpc.tool_services.mcp.config import McpBridgeSettings, McpServerConfig
from antwort_grpc.tool_services.mcp.results import executor_tool, function_output, progress_message
from antwort_grpc.tool_services.sdk import text_result
from antwort_grpc.tracing import headers as trace_headers

log = logging.getLogger(__name__)

CLIENT_INFO = mt.Implementation(name="antwort-grpc-mcp-bridge", version="0.1.0")
FIRST_BACKOFF = 0.1
# A server that paginates forever must not keep the owner listing forever.
MAX_PAGES = 1000

T = TypeVar("T")


class ServerConnection:
    def __init__(self, config: McpServerConfig, settings: McpBridgeSettings) -> None:
        self.config = config
        self.label = config.label
        self.settings = settings
        # The last listing; kept while the server is away, so calls of its tools get an
        # "unavailable" result instead of the tools vanishing mid-conversation.
        self.tools: list[mt.Tool] = []
        self.last_error: str | None = "not connected yet"
        self._client: Client | None = None
        self._owner: asyncio.Task[None] | None = None
        # The owner's flags; `_attention` wakes it to look at them.
        self._stopping = False
        self._lost = False
        self._attention = asyncio.Event()
        # Connection attempts finished so far (either way), for callers waiting on one.
        self._attempts = 0
        # Counts connections, so the end of an earlier one is not taken for the current one's.
        self._generation = 0
        self._changed = asyncio.Condition()
        self._listing = asyncio.Lock()

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._owner = asyncio.create_task(self._own(), name=f"mcp-connection-{self.label}")

    async def first_attempt(self) -> None:
        """Wait until the first connection attempt has finished, whatever its outcome."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._attempts > 0)

    async def close(self, timeout: float = 10.0) -> None:
        if self._owner is None:
            return
        self._stopping = True
        self._attention.set()
        if not self.connected:
            # Connecting or waiting to: nothing to close gracefully. The owner unwinds what it
            # entered in its own task.
            self._owner.cancel()
        done, _ = await asyncio.wait({self._owner}, timeout=timeout)
        if not done:
            log.warning("MCP server %r: the connection did not close in %.0fs; cancelling it", self.label, timeout)
            self._owner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._owner

    @property
    def connected(self) -> bool:
        return self._client is not None and not self._lost

    # -- what callers use ------------------------------------------------------------------

    def executor_tools(self) -> list[pb.ExecutorTool]:
        return [executor_tool(tool, self.label) for tool in self.tools]

    def offers(self, name: str) -> bool:
        return any(tool.name == name for tool in self.tools)

    async def refresh(self, wait: float | None = None) -> bool:
        """List the tools again now (connecting first if need be, waiting at most `wait`
        seconds, by default connect_timeout); False when the server is not reachable."""
        client = await self._ready(wait)
        if client is None:
            return False
        try:
            await self._list_tools(client)
        except MCPError as err:
            self._note_failure(client, err)
            return False
        return True

    async def call(self, name: str, arguments: dict[str, Any], progress: ProgressSink) -> pb.FunctionCallOutput:
        client = await self._ready()
        if client is None:
            return text_result(f"MCP server {self.label!r} is unavailable: {self.last_error}", is_error=True)
        if not self.offers(name):
            # A tool the server added since the last listing: list on demand. A name the server
            # does not list is never called, even if the server would run it.
            with contextlib.suppress(MCPError):
                await self._list_tools(client)
            if not self.offers(name):
                return text_result(f"MCP server {self.label!r} offers no tool named {name!r}", is_error=True)

        report = progress

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            report(progress_message(progress, total, message))

        try:
            result = await client.call_tool(
                name,
                arguments,
                read_timeout_seconds=self.settings.call_timeout,
                progress_callback=on_progress,
                # The caller's trace context in the request's _meta (MCP has no headers per call).
                meta=trace_headers(),  # type: ignore[arg-type]
            )
        except MCPError as err:
            if self._note_failure(client, err):
                return text_result(f"lost the connection to MCP server {self.label!r}: {err}", is_error=True)
            if err.code == mt.REQUEST_TIMEOUT:
                return text_result(
                    f"tool {name!r} on MCP server {self.label!r} timed out after {self.settings.call_timeout:g}s",
                    is_error=True,
                )
            return text_result(f"MCP server {self.label!r} refused the call of {name!r}: {err}", is_error=True)
        except RuntimeError as err:
            # The SDK checks structured content against the tool's output schema.
            return text_result(f"tool {name!r} on MCP server {self.label!r}: {err}", is_error=True)
        return function_output(result)

    async def _ready(self, wait: float | None = None) -> Client | None:
        """The live client, or — when there is none — the outcome of one connection attempt
        made now, waited for at most `wait` (by default connect_timeout). None: unavailable."""
        if self.connected:
            return self._client
        seen = self._attempts
        self._attention.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.settings.connect_timeout if wait is None else wait), self._changed:
                await self._changed.wait_for(lambda: self.connected or self._attempts > seen)
        return self._client if self.connected else None

    def _note_failure(self, client: Client, err: MCPError) -> bool:
        """Whether the error says the connection is gone; if so, the owner reconnects (unless it
        already has: the failed request may have been made on an earlier connection)."""
        gone = err.code == mt.CONNECTION_CLOSED or (err.code == mt.INVALID_REQUEST and "Session terminated" in str(err))
        if gone and client is self._client and not self._lost:
            log.warning("MCP server %r: connection lost (%s)", self.label, err)
            self.last_error = str(err)
            self._lost = True
            self._attention.set()
        return gone

    # -- the owner task --------------------------------------------------------------------

    async def _own(self) -> None:
        backoff = FIRST_BACKOFF
        while not self._stopping:
            self._generation += 1
            self._lost = False
            self._attention.clear()
            connected = False
            try:
                async with contextlib.AsyncExitStack() as stack:
                    async with asyncio.timeout(self.settings.connect_timeout):
                        client = await self._connect(stack)
                        await self._list_tools(client)
                    self._client = client
                    connected = True
                    self.last_error = None
                    log.info("MCP server %r: connected, %d tools", self.label, len(self.tools))
                    try:
                        await self._attempt_finished()
                        await self._serve(client)
                    finally:
                        # Not offered to callers while the client is being closed.
                        self._client = None
            except Exception as err:
                # A failed connect, a transport that died (its task group cancels this task and
                # re-raises the cause here, grouped), or a close that went wrong.
                error = _describe(err)
                # A server that stays down fails the same way on every attempt: say it once.
                log.log(
                    logging.DEBUG if error == self.last_error else logging.WARNING,
                    "MCP server %r: %s",
                    self.label,
                    error,
                )
                self.last_error = error
            finally:
                self._client = None
            if not connected:
                await self._attempt_finished()
            if self._stopping:
                break
            backoff = FIRST_BACKOFF if connected else min(backoff * 2, self.settings.reconnect_max_seconds)
            # Wait before the next attempt, unless a caller wants the server now.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(backoff):
                    await self._attention.wait()

    async def _serve(self, client: Client) -> None:
        """While connected: list the tools again every `refresh_seconds` or when woken (the
        server said its list changed), until the connection is lost or the bridge stops."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.refresh_seconds):
                    await self._attention.wait()
            self._attention.clear()
            if self._stopping or self._lost:
                return
            try:
                await self._list_tools(client)
            except MCPError as err:
                if self._note_failure(client, err):
                    return
                log.warning("MCP server %r: listing tools failed: %s", self.label, err)
            except Exception as err:
                # A malformed listing: keep the connection and the previous listing.
                log.warning("MCP server %r: listing tools failed: %s", self.label, _describe(err))

    async def _attempt_finished(self) -> None:
        self._attempts += 1
        async with self._changed:
            self._changed.notify_all()

    async def _connect(self, stack: contextlib.AsyncExitStack) -> Client:
        client = Client(
            self._transport(stack),
            cache=None,  # the bridge keeps its own listing
            client_info=CLIENT_INFO,
            message_handler=self._on_message,
            # The default bound of requests other than calls (handshake, listing): a server that
            # accepts requests and never answers must not hold the owner.
            read_timeout_seconds=self.settings.connect_timeout,
        )
        return await stack.enter_async_context(client)

    def _transport(self, stack: contextlib.AsyncExitStack) -> Transport:
        config = self.config
        inner: Transport
        if config.transport == "stdio":
            assert config.command is not None
            params = StdioServerParameters(command=config.command, args=config.args, env=config.env, cwd=config.cwd)
            inner = stdio_client(params)
        else:
            assert config.url is not None
            http = httpx2.AsyncClient(
                headers=config.resolved_headers(),
                timeout=httpx2.Timeout(self.settings.connect_timeout, read=self.settings.call_timeout),
            )
            inner = streamable_http_client(config.url, http_client=_entered(stack, http))
        generation = self._generation
        return _watched(inner, lambda: self._connection_ended(generation))

    def _connection_ended(self, generation: int) -> None:
        # Only the end of the live connection counts: a connection that never came up fails
        # its connect, and one that is being closed has already been given up.
        if generation == self._generation and self.connected and not self._stopping:
            log.warning("MCP server %r: the connection ended", self.label)
            self.last_error = "the connection ended"
            self._lost = True
            self._attention.set()

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(message, mt.ToolListChangedNotification):
            self._attention.set()  # the owner lists again
        elif isinstance(message, Exception):
            log.debug("MCP server %r: transport error: %s", self.label, message)

    async def _list_tools(self, client: Client) -> None:
        """All pages of tools/list; replaces the listing only when every page arrived."""
        async with self._listing:
            tools: list[mt.Tool] = []
            cursor: str | None = None
            seen: set[str] = set()
            for _ in range(MAX_PAGES):
                page = await client.list_tools(cursor=cursor)
                tools.extend(page.tools)
                cursor = page.next_cursor
                if cursor is None or cursor in seen:
                    break
                seen.add(cursor)
            self.tools = tools


def _entered(stack: contextlib.AsyncExitStack, http: httpx2.AsyncClient) -> httpx2.AsyncClient:
    # The SDK leaves a caller-provided HTTP client open; close it with the connection.
    stack.push_async_callback(http.aclose)
    return http


@contextlib.asynccontextmanager
async def _watched(transport: Transport, on_end: Callable[[], None]) -> AsyncIterator[TransportStreams]:
    """The transport, with its read stream reporting when the server side has ended (a stdio
    server that exited): the session only fails the waiting requests, the owner must know too."""
    async with transport as (read_stream, write_stream):
        yield _EndWatch(read_stream, on_end), write_stream


class _EndWatch(Generic[T]):
    def __init__(self, inner: Any, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    @property
    def last_context(self) -> Any:
        # The dispatcher reads the sender's context from streams that carry one.
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> T:
        try:
            item: T = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise
        return item

    def __aiter__(self) -> _EndWatch[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _EndWatch[T]:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _describe(err: BaseException) -> str:
    """The innermost causes of an error, without anyio's exception-group wrapping."""
    if isinstance(err, BaseExceptionGroup):
        return "; ".join(dict.fromkeys(_describe(e) for e in err.exceptions))
    if isinstance(err, TimeoutError):
        return "no answer in time"
    text = str(err) or type(err).__name__
    return f"{type(err).__name__}: {text}" if not isinstance(err, MCPError) else text


def parse_arguments(arguments: str) -> dict[str, Any]:
    """The model's JSON arguments as an object (an empty string means no arguments)."""
    value = json.loads(arguments) if arguments.strip() else {}
    if not isinstance(value, dict):
        raise ValueError("the arguments must be a JSON object")
    return value
