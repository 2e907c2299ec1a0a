"""The fake OpenAI-compatible backend, as the benchmarks drive it: `python -m bench.backend`.

It is `antwort_grpc.testing.fake_openai.FakeOpenAI` (real HTTP, real SSE, the same chunks) with
two additions: the answer is chosen from the request itself, so any number of concurrent
conversations can share one backend process, and text deltas can carry the moment they were
written (CLOCK_MONOTONIC, shared by every process on the machine) so a client can measure the
delay from the backend sending a token to its event arriving.

The model name says what to answer, e.g. `bench?words=20&delay=0.25&tools=1&stamp=1`:
`words` text deltas (each `delay` seconds apart), and while the conversation holds fewer than
`tools` tool results, a call of the function `noop` after the text.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import time
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from aiohttp import web

from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply, ScriptedToolCall
from bench.procs import until_stopped

# Replaced, when the chunk is written, by the time in nanoseconds.
STAMP = "@STAMP@"

_BODY: ContextVar[dict[str, Any]] = ContextVar("bench_body")


@dataclass(frozen=True, slots=True)
class Plan:
    words: int = 20
    delay: float = 0.0
    tools: int = 0
    stamp: bool = False

    @classmethod
    def of(cls, model: str) -> Plan:
        query = {k: v[-1] for k, v in parse_qs(urlsplit(model).query).items()}
        return cls(
            words=int(query.get("words", 20)),
            delay=float(query.get("delay", 0.0)),
            tools=int(query.get("tools", 0)),
            stamp=query.get("stamp", "0") == "1",
        )


def model_name(words: int = 20, delay: float = 0.0, tools: int = 0, stamp: bool = False) -> str:
    return f"bench?words={words}&delay={delay:g}&tools={tools}&stamp={int(stamp)}"


def reply_for(body: dict[str, Any]) -> Reply:
    plan = Plan.of(str(body.get("model", "")))
    answered = sum(1 for m in body.get("messages", ()) if m.get("role") == "tool")
    text = [f"{STAMP} "] * plan.words if plan.stamp else ["word "] * plan.words
    calls = []
    if answered < plan.tools:
        calls = [ScriptedToolCall(name="noop", arguments=f'{{"round": {answered}}}', fragments=1)]
    return Reply(text=text, tool_calls=calls, delay=plan.delay)


class BenchBackend(FakeOpenAI):
    def __init__(self, port: int = 0) -> None:
        super().__init__(port=port, backlog=4096)
        # Long runs: remember only the last few requests.
        self.requests = collections.deque(maxlen=16)  # type: ignore[assignment]

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        # aiohttp keeps the body: the base handler reads it again.
        _BODY.set(await request.json())
        return await super()._chat(request)

    def _take(self) -> Reply | None:
        return reply_for(_BODY.get())

    async def _stream(self, request: web.Request, reply: Reply, model: str, include_usage: bool) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for n, payload in enumerate(self._events(reply, model, include_usage)):
            if n >= reply.delay_from and reply.delay:
                await asyncio.sleep(reply.delay)
            if STAMP in payload:
                payload = payload.replace(STAMP, str(time.monotonic_ns()))
            await response.write(b"data: " + payload.encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def _serve(port: int) -> None:
    backend = BenchBackend(port)
    await backend.start()
    print(f"READY {backend.port}", flush=True)
    try:
        await until_stopped()
    finally:
        await backend.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.port))


if __name__ == "__main__":
    main()
