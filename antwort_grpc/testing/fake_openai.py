"""A fake OpenAI-compatible backend: a real HTTP/1.1 server speaking /v1/chat/completions.

It answers from a script (one `Reply` per request, in order), streams real SSE
(`data: {...}\\n\\n`, then `data: [DONE]`), and records what it received and every client that
went away mid-answer. Tests drive it in-process; the demo and the benchmarks run it as a process:

    python -m antwort_grpc.testing.fake_openai --port 8011 --script demo.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from antwort_grpc.tasks import Started
from antwort_grpc.testing.fake_openai_script import (
    Reply,
    Script,
    ScriptedToolCall,
    history_problem,
    split_fragments,
    split_words,
)

__all__ = ["FakeOpenAI", "ReceivedRequest", "Reply", "Script", "ScriptedToolCall"]


@dataclass(frozen=True, slots=True)
class ReceivedRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class FakeOpenAI(Started):
    """`async with FakeOpenAI(Reply(text="hi")) as fake:` then point a provider at `fake.url`."""

    def __init__(
        self,
        *replies: Reply,
        loop: bool = False,
        models: list[str] | None = None,
        api_key: str | None = None,
        port: int = 0,
        backlog: int = 128,
        strict: bool = False,
    ) -> None:
        # backlog: the listen queue; a benchmark opening a thousand connections at once needs more.
        self._backlog = backlog
        self.script = Script(replies=list(replies), loop=loop, models=models, api_key=api_key, strict=strict)
        self.requests: list[ReceivedRequest] = []
        self.disconnects = 0
        self.in_flight = 0
        self._port = port
        self._queue: list[Reply] = []
        self._next = 0
        self._calls = 0
        self._disconnected = asyncio.Event()
        self._received = asyncio.Event()
        # A stream waiting at its reply's `hold_at`, and the gate that lets it go on.
        self._holding = asyncio.Event()
        self._released = asyncio.Event()
        # Tests that pace a stream: each data event after the first waits for a permit.
        self.pace: asyncio.Semaphore | None = None
        # Data events written (of every stream), and the signal of each one.
        self.written = 0
        self._wrote = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._bound_port = 0
        self._expand()

    @classmethod
    def from_script(cls, script: Script, port: int = 0) -> FakeOpenAI:
        return cls(
            *script.replies,
            loop=script.loop,
            models=script.models,
            api_key=script.api_key,
            port=port,
            strict=script.strict,
        )

    def add(self, *replies: Reply) -> None:
        self.script.replies.extend(replies)
        self._expand()

    def _expand(self) -> None:
        self._queue = [reply for reply in self.script.replies for _ in range(reply.times)]

    @property
    def port(self) -> int:
        return self._bound_port

    @property
    def url(self) -> str:
        """The base URL a client appends /chat/completions to."""
        return f"http://127.0.0.1:{self._bound_port}/v1"

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        return [r.body for r in self.requests if r.path.endswith("/chat/completions")]

    async def wait_for_requests(self, count: int = 1, timeout: float = 5.0) -> None:
        """Returns once `count` requests have arrived (raises TimeoutError otherwise)."""
        async with asyncio.timeout(timeout):
            while len(self.requests) < count:
                self._received.clear()
                await self._received.wait()

    async def wait_for_disconnect(self, timeout: float = 5.0) -> None:
        """Returns once a client has gone away mid-answer (raises TimeoutError otherwise)."""
        async with asyncio.timeout(timeout):
            await self._disconnected.wait()

    async def wait_held(self, timeout: float = 5.0) -> None:
        """Returns once a stream waits at its reply's `hold_at` (raises TimeoutError otherwise)."""
        async with asyncio.timeout(timeout):
            await self._holding.wait()

    async def wait_written(self, count: int, timeout: float = 5.0) -> None:
        """Returns once `count` data events have been written (raises TimeoutError otherwise)."""
        async with asyncio.timeout(timeout):
            while self.written < count:
                self._wrote.clear()
                await self._wrote.wait()

    def release(self) -> None:
        """Let the held streams go on; a later reply with `hold_at` holds again."""
        self._released.set()
        self._released = asyncio.Event()
        self._holding = asyncio.Event()

    async def start(self) -> None:
        # As large a body as a real backend takes (aiohttp's default is 1 MiB): a request at the
        # gateway's limits is about 10 MB of JSON.
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        # Cancelling the handler when the client disconnects is what makes disconnects visible
        # at once, even while the handler sleeps between slow tokens.
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self._port))
        self._bound_port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock, backlog=self._backlog).start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _take(self) -> Reply | None:
        if self._next >= len(self._queue):
            if not self.script.loop or not self._queue:
                return None
            self._next = 0
        reply = self._queue[self._next]
        self._next += 1
        return reply

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _models(self, request: web.Request) -> web.Response:
        self.requests.append(ReceivedRequest(request.path, dict(request.headers), {}))
        if (denied := self._check_auth(request)) is not None:
            return denied
        names = self.script.models or ["fake-model"]
        return web.json_response({"object": "list", "data": [{"id": n, "object": "model"} for n in names]})

    def _check_auth(self, request: web.Request) -> web.Response | None:
        if self.script.api_key is None:
            return None
        if request.headers.get("Authorization") == f"Bearer {self.script.api_key}":
            return None
        return _error(401, "Incorrect API key provided.", "invalid_api_key", "authentication_error")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(ReceivedRequest(request.path, dict(request.headers), body))
        self._received.set()
        if (denied := self._check_auth(request)) is not None:
            return denied
        if self.script.strict and (problem := history_problem(body.get("messages") or [])) is not None:
            return _error(400, problem, None)
        model = str(body.get("model", ""))
        if self.script.models is not None and model not in self.script.models:
            return _error(404, f"The model `{model}` does not exist.", "model_not_found")
        reply = self._take()
        if reply is None:
            return _error(500, "fake backend: script exhausted", "script_exhausted", "server_error")
        self.in_flight += 1
        try:
            if reply.first_delay:
                await asyncio.sleep(reply.first_delay)
            if reply.status != 200:
                message = reply.error_message or f"fake backend error {reply.status}"
                return _error(reply.status, message, reply.error_code, headers=reply.headers)
            if reply.logprobs and not body.get("logprobs"):
                reply = reply.model_copy(update={"logprobs": False})  # as backends do: only when asked
            if not body.get("stream"):
                if reply.malformed_at is not None:
                    return web.Response(text="{not json", content_type="application/json")
                return web.json_response(self._completion(reply, model), headers=reply.headers)
            return await self._stream(request, reply, model, _include_usage(body))
        except (asyncio.CancelledError, ConnectionResetError):
            self.disconnects += 1
            self._disconnected.set()
            raise
        finally:
            self.in_flight -= 1

    async def _stream(self, request: web.Request, reply: Reply, model: str, include_usage: bool) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", **reply.headers})
        await response.prepare(request)
        payloads = reply.raw if reply.raw is not None else list(self._events(reply, model, include_usage))
        for n, payload in enumerate(payloads):
            if reply.cut_after is not None and n >= reply.cut_after:
                assert request.transport is not None
                request.transport.abort()
                return response
            if n == reply.hold_at:
                released = self._released
                self._holding.set()
                await released.wait()
            if n >= reply.delay_from and reply.delay:
                await asyncio.sleep(reply.delay)
            if n and self.pace is not None:
                await self.pace.acquire()
            data = "{not json" if n == reply.malformed_at else payload
            await response.write(b"data: " + data.encode() + b"\n\n")
            self.written += 1
            self._wrote.set()
        if reply.send_done:
            await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _call_id(self, call: ScriptedToolCall) -> str:
        if call.id is not None:
            return call.id
        self._calls += 1
        return f"call_{self._calls}"

    def _events(self, reply: Reply, model: str, include_usage: bool) -> Iterator[str]:
        head = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": int(time.time())}
        head["model"] = model

        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            logprobs = _logprobs([delta["content"]]) if reply.logprobs and delta.get("content") else None
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            return json.dumps({**head, "choices": [choice]})

        if reply.role_chunk:
            yield chunk({"role": "assistant", "content": ""})
        for piece in split_words(reply.reasoning):
            yield chunk({"reasoning_content": piece})
        for piece in split_words(reply.text):
            yield chunk({"content": piece})
        if reply.refusal:
            yield chunk({"refusal": reply.refusal})
        for index, call in enumerate(reply.tool_calls):
            function = {"name": call.name, "arguments": ""}
            first = {"index": index, "id": self._call_id(call), "type": "function", "function": function}
            yield chunk({"tool_calls": [first]})
            for fragment in split_fragments(call.arguments, call.fragments):
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
        yield chunk({}, _finish_reason(reply))
        if include_usage:
            yield json.dumps({**head, "choices": [], "usage": _usage(reply)})

    def _completion(self, reply: Reply, model: str) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(split_words(reply.text)) or None}
        if reply.reasoning:
            message["reasoning_content"] = "".join(split_words(reply.reasoning))
        if reply.refusal:
            message["refusal"] = reply.refusal
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": self._call_id(call),
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in reply.tool_calls
            ]
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": _finish_reason(reply),
                    "logprobs": _logprobs(split_words(reply.text)) if reply.logprobs else None,
                }
            ],
            "usage": _usage(reply),
        }


def _logprobs(tokens: list[str]) -> dict[str, Any]:
    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    return {"content": [{**entry(t, -0.5), "top_logprobs": [entry(t, -0.5), entry("x", -3.0)]} for t in tokens]}


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


def _finish_reason(reply: Reply) -> str:
    if reply.finish_reason is not None:
        return reply.finish_reason
    return "tool_calls" if reply.tool_calls else "stop"


def _usage(reply: Reply) -> dict[str, Any]:
    completion = reply.completion_tokens
    if completion is None:
        completion = len(split_words(reply.text)) + len(split_words(reply.reasoning))
        completion += sum(len(split_fragments(c.arguments, c.fragments)) for c in reply.tool_calls)
    total = reply.prompt_tokens + completion
    usage: dict[str, Any] = {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": total,
    }
    if reply.cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": reply.cached_tokens}
    if reply.reasoning_tokens is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reply.reasoning_tokens}
    return usage


def _error(
    status: int,
    message: str,
    code: str | None = None,
    kind: str = "invalid_request_error",
    headers: dict[str, str] | None = None,
) -> web.Response:
    if status >= 500 and kind == "invalid_request_error":
        kind = "server_error"
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return web.json_response(body, status=status, headers=headers)


async def _serve(args: argparse.Namespace, script: Script) -> None:
    fake = FakeOpenAI.from_script(script, port=args.port)
    await fake.start()
    print(f"fake OpenAI backend listening on {fake.url}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await fake.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--script", help="JSON file: {replies: [...], loop, models, api_key}")
    parser.add_argument("--loop", action="store_true", help="start over when the replies are used up")
    parser.add_argument("--strict", action="store_true", help="reject histories OpenAI rejects (HTTP 400)")
    args = parser.parse_args()
    script = Script.model_validate_json(Path(args.script).read_text()) if args.script else Script()
    script.loop = script.loop or args.loop
    script.strict = script.strict or args.strict
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args, script))


if __name__ == "__main__":
    main()
