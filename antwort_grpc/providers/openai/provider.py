"""The provider for OpenAI-compatible /v1/chat/completions backends (vLLM, Ollama, LiteLLM,
llama.cpp's server, OpenAI), on aiohttp with a pool of keep-alive connections.

aiohttp was chosen by measurement: about a fifth of httpx's client CPU per request (see
scripts/measure_http_clients.py and docs/providers.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TypeVar

import aiohttp
from pydantic import ValidationError

from antwort_grpc.offload import off_loop
from antwort_grpc.providers.base import Completion, ProviderError, ProviderEvent, ProviderHealth, TurnRequest
from antwort_grpc.providers.coalesce import MAX_MERGED, delta_size, merge_deltas, mergeable
from antwort_grpc.providers.openai.chunks import decode_chunk, protocol_error
from antwort_grpc.providers.openai.config import BackendConfig
from antwort_grpc.providers.openai.errors import backoff, retry_after, status_error, structured_refusal
from antwort_grpc.providers.openai.request import encode_body
from antwort_grpc.providers.openai.sse import SseParser
from antwort_grpc.providers.openai.translate import StreamTranslator, completion
from antwort_grpc.providers.openai.wire import ChatCompletion
from antwort_grpc.tracing import headers as trace_headers

log = logging.getLogger(__name__)

T = TypeVar("T")
_DONE = b"[DONE]"
_USER_AGENT = "antwort-grpc"


class _Retry(ProviderError):
    """A failure another attempt may cure; `after` is the wait the backend asked for."""

    def __init__(self, code: str, message: str, after: float | None = None) -> None:
        super().__init__(code, message, retryable=True)
        self.after = after


class OpenAICompatProvider:
    """Provider for one OpenAI-compatible backend. Create it anywhere; the HTTP session is
    opened on first use in the running loop. Call `aclose()` at shutdown."""

    # Deltas that come in one read of the backend leave as one (providers/coalesce.py).
    coalesces = True

    def __init__(self, config: BackendConfig) -> None:
        self.config = config
        headers = {"User-Agent": _USER_AGENT, "Content-Type": "application/json", **config.headers}
        if config.api_key:
            headers["Authorization"] = f"Bearer {config.api_key}"
        self._headers = headers
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=config.connect_timeout, sock_read=config.read_timeout
        )
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            connector = aiohttp.TCPConnector(limit=self.config.max_connections, ttl_dns_cache=60)
            self._session = aiohttp.ClientSession(
                connector=connector, headers=self._headers, timeout=self._timeout, trust_env=False
            )
            self._loop = loop
        return self._session

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def stream(self, turn: TurnRequest) -> AsyncGenerator[ProviderEvent, None]:
        model = turn.model or self.config.model
        body = await _body(turn, stream=True, model=model)
        attempt = 0
        while True:
            started = False
            try:
                # aclosing: a caller that stops iterating closes the HTTP response now, not at GC.
                async with contextlib.aclosing(self._stream_once(body, model, turn)) as events:
                    async for event in events:
                        started = True
                        yield event
                return
            except _Retry as error:
                # Once a token went out, a retry would repeat it: the caller gets the error
                # and keeps what it has.
                if started:
                    raise ProviderError(error.code, error.message) from None
                await self._before_retry(error, attempt)
                attempt += 1

    async def complete(self, turn: TurnRequest) -> Completion:
        model = turn.model or self.config.model
        body = await _body(turn, stream=False, model=model)
        structured = turn.text_format is not None
        return await self._with_retries(lambda: self._complete_once(body, model, structured))

    async def check_health(self) -> ProviderHealth:
        """Cheap reachability probe (GET /models) for the gateway's health service."""
        timeout = aiohttp.ClientTimeout(total=max(1.0, self.config.connect_timeout))
        try:
            async with self._client().get(self.config.models_url, timeout=timeout) as response:
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as error:
            return ProviderHealth(False, f"model backend {self.config.base_url} unreachable: {error!r}")
        if status in (401, 403):
            return ProviderHealth(False, f"model backend {self.config.base_url} rejects our credentials")
        if status >= 500:
            return ProviderHealth(False, f"model backend {self.config.base_url} answers HTTP {status}")
        # 404 is fine: some backends have no /models route, but they are up.
        return ProviderHealth(True, f"model backend {self.config.base_url} reachable")

    async def _with_retries(self, call: Callable[[], Awaitable[T]]) -> T:
        attempt = 0
        while True:
            try:
                return await call()
            except _Retry as error:
                await self._before_retry(error, attempt)
                attempt += 1

    async def _before_retry(self, error: _Retry, attempt: int) -> None:
        """Sleeps before the next attempt, or raises the final error when the bound is reached."""
        config = self.config
        if attempt >= config.max_retries:
            raise ProviderError(error.code, f"{error.message} (gave up after {attempt + 1} attempts)") from None
        if error.after is not None:
            if error.after > config.max_retry_after:
                raise ProviderError(
                    error.code, f"{error.message} (the backend asks to retry in {error.after:.0f} s)"
                ) from None
            delay = error.after
        else:
            delay = backoff(attempt, base=config.backoff_base, cap=config.backoff_cap)
        log.info("model backend attempt %d failed (%s); retrying in %.2f s", attempt + 1, error.message, delay)
        await asyncio.sleep(delay)

    async def _post(self, body: bytes, model: str, structured: bool = False) -> aiohttp.ClientResponse:
        """POSTs and returns a 2xx response with its body unread; raises for everything else.
        `structured`: the body asks for response_format (a refusal names it)."""
        url = self.config.chat_url
        try:
            response = await self._client().post(url, data=body, headers=trace_headers())
        except aiohttp.ClientConnectorError as error:
            raise _Retry("backend_unavailable", f"cannot connect to the model backend at {url}: {error}") from None
        except TimeoutError:
            raise _Retry("backend_unavailable", f"the model backend at {url} did not answer in time") from None
        except aiohttp.ClientError as error:
            raise _Retry("backend_unavailable", f"the model backend at {url} failed: {error!r}") from None
        if response.status < 300:
            return response
        try:
            content = await response.read()
        except (aiohttp.ClientError, TimeoutError):
            content = b""
        finally:
            response.release()
        failure = status_error(response.status, content, model=model, url=url)
        if failure.retryable:
            raise _Retry(failure.code, failure.message, retry_after(response.headers))
        raise structured_refusal(failure) if structured else failure

    async def _complete_once(self, body: bytes, model: str, structured: bool) -> Completion:
        response = await self._post(body, model, structured)
        try:
            content = await response.read()
        except (aiohttp.ClientError, TimeoutError) as error:
            raise _Retry("backend_unavailable", f"the model backend broke off its answer: {error!r}") from None
        finally:
            response.release()
        try:
            return completion(ChatCompletion.model_validate_json(content))
        except ValidationError as error:
            raise protocol_error(content, error) from None

    async def _stream_once(self, body: bytes, model: str, turn: TurnRequest) -> AsyncGenerator[ProviderEvent, None]:
        response = await self._post(body, model, turn.text_format is not None)
        translator = StreamTranslator()
        parser = SseParser()
        reader = response.content
        clean = False
        try:
            try:
                # Nothing passed on yet: the turn's first event leaves as soon as it is parsed,
                # not after the rest of its read (coalescing adds no latency to the first token).
                first = True
                while not clean:
                    block = await reader.readany()
                    payloads = parser.feed(block) if block else parser.finish()
                    while payloads and not clean:
                        # One payload at a time until the first event has left (unless the request
                        # asks for a hold), and always without coalescing; else the read at once.
                        take = len(payloads) if turn.coalesce and (not first or turn.max_hold) else 1
                        batch, payloads = payloads[:take], payloads[take:]
                        events: list[ProviderEvent] = []
                        broken: ProviderError | None = None
                        try:
                            clean = self._feed(batch, translator, events)
                            if not payloads and not clean and block and _holds(turn, events):
                                clean = await self._hold(reader, parser, translator, events, turn.max_hold)
                        except _Broken as error:
                            broken = error.error
                        if events:
                            first = False
                        for event in merge_deltas(events) if turn.coalesce else events:
                            yield event
                        if broken is not None:
                            raise broken
                    if not block:
                        break
            except aiohttp.ClientPayloadError as error:
                raise _Retry("backend_unavailable", f"the model backend broke off its answer: {error}") from None
            except TimeoutError:
                raise _Retry(
                    "backend_unavailable",
                    f"the model backend sent nothing for {self.config.read_timeout:g} s",
                ) from None
            except aiohttp.ClientError as error:
                raise _Retry("backend_unavailable", f"the model backend failed mid-answer: {error!r}") from None
            if not clean and not translator.finished:
                raise ProviderError("backend_protocol_error", "the model backend ended its stream mid-answer")
            clean = True
            yield translator.end()
        finally:
            # An unfinished answer (error, cancellation, caller gone) must not go back to the
            # pool: closing the connection is how the backend learns to stop generating.
            if clean:
                response.release()
            else:
                response.close()

    @staticmethod
    def _feed(payloads: list[bytes], translator: StreamTranslator, events: list[ProviderEvent]) -> bool:
        """Translate one read's payloads into `events`; True once [DONE] came. A bad payload
        raises _Broken with the events before it, which the caller passes on first."""
        for data in payloads:
            if data == _DONE:
                return True
            try:
                events += translator.feed(decode_chunk(data))
            except ProviderError as error:
                raise _Broken(error) from None
        return False

    async def _hold(
        self,
        reader: aiohttp.StreamReader,
        parser: SseParser,
        translator: StreamTranslator,
        events: list[ProviderEvent],
        hold: float,
    ) -> bool:
        """The request allows a delta to wait: read on for up to `hold` seconds while the last
        event is still a delta that more could join. True once [DONE] came."""
        loop = asyncio.get_running_loop()
        until = loop.time() + hold
        while (remaining := until - loop.time()) > 0:
            try:
                block = await asyncio.wait_for(reader.readany(), remaining)
            except TimeoutError:
                return False
            if not block:
                return False  # the end of the stream: the caller's next read sees it too
            if self._feed(parser.feed(block), translator, events):
                return True
            if not mergeable(events[-1]) or sum(map(delta_size, events)) >= MAX_MERGED:
                return False
        return False


# A turn this large has its body built in a worker thread: converting it takes tens of
# milliseconds up to about a second (128 tools with 64 KiB schemas, 2,048 items), which on the
# event loop would stall every other stream and the health checks.
_THREAD_TOOLS = 8
_THREAD_ITEMS = 256


async def _body(turn: TurnRequest, *, stream: bool, model: str) -> bytes:
    if len(turn.tools) > _THREAD_TOOLS or len(turn.items) > _THREAD_ITEMS:
        return await off_loop(encode_body, turn, stream=stream, model=model)
    return encode_body(turn, stream=stream, model=model)


def _holds(turn: TurnRequest, events: list[ProviderEvent]) -> bool:
    """Whether the request lets the last delta of a read wait for more of its part."""
    return bool(turn.max_hold and turn.coalesce and events and mergeable(events[-1]))


class _Broken(Exception):
    """A payload that cannot be used, after the events of the same read that came before it."""

    def __init__(self, error: ProviderError) -> None:
        super().__init__(error.message)
        self.error = error
