"""Measures the client-side CPU time per chat-completions request of candidate async HTTP clients.

The fake backend runs in its own process, so time.process_time() here counts only the client:
building the request, HTTP/1.1 on a pooled keep-alive connection, reading the body (streaming:
splitting SSE lines). JSON parsing is measured apart, as it is the same for every client.

    .venv/bin/python scripts/measure_http_clients.py [--requests 2000] [--concurrency 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httpx
import orjson

from antwort_grpc import pb
from antwort_grpc.providers.base import TurnRequest
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.providers.openai.sse import SseParser
from antwort_grpc.providers.openai.wire import ChatCompletionChunk

TEXT = [f"tok{i} " for i in range(20)]
BODY = json.dumps(
    {
        "model": "fake-model",
        "messages": [{"role": "user", "content": "Say twenty words."}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
).encode()
BODY_PLAIN = BODY.replace(b'"stream": true', b'"stream": false')
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-measure"}

Request = Callable[[], Awaitable[int]]


def start_backend() -> tuple[subprocess.Popen[str], str]:
    script = {"replies": [{"text": TEXT}], "loop": True}
    path = Path(tempfile.mkdtemp()) / "script.json"
    path.write_text(json.dumps(script))
    command = [sys.executable, "-m", "antwort_grpc.testing.fake_openai", "--port", "0", "--script", str(path)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    return process, line.rsplit(" ", 1)[-1].strip() + "/chat/completions"


async def run(request: Request, requests: int, concurrency: int) -> float:
    for _ in range(50):  # warm up the pool and the code paths
        await request()
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            assert await request() > 0

    start = time.process_time()
    await asyncio.gather(*(one() for _ in range(requests)))
    return (time.process_time() - start) / requests * 1e6


async def measure_httpx(url: str, n: int, c: int) -> dict[str, float]:
    limits = httpx.Limits(max_keepalive_connections=c, max_connections=c)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:

        async def plain() -> int:
            response = await client.post(url, content=BODY_PLAIN, headers=HEADERS)
            return len(response.content)

        async def stream() -> int:
            lines = 0
            async with client.stream("POST", url, content=BODY, headers=HEADERS) as response:
                async for line in response.aiter_lines():
                    lines += line.startswith("data:")
            return lines

        return {"non-streaming": await run(plain, n, c), "streaming": await run(stream, n, c)}


async def measure_aiohttp(url: str, n: int, c: int) -> dict[str, float]:
    connector = aiohttp.TCPConnector(limit=c)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def plain() -> int:
            async with session.post(url, data=BODY_PLAIN, headers=HEADERS) as response:
                return len(await response.read())

        async def stream() -> int:
            parser = SseParser()
            events = 0
            async with session.post(url, data=BODY, headers=HEADERS) as response:
                async for block in response.content.iter_any():
                    events += len(parser.feed(block))
            return events

        return {"non-streaming": await run(plain, n, c), "streaming": await run(stream, n, c)}


async def measure_raw(url: str, n: int, c: int) -> dict[str, float]:
    """A minimal HTTP/1.1 client on asyncio streams: the floor, not a candidate."""
    host, port = url.split("//")[1].split("/")[0].split(":")
    path = "/" + url.split("//")[1].split("/", 1)[1]
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    for _ in range(c):
        conns.append(await asyncio.open_connection(host, int(port)))

    async def call(body: bytes) -> int:
        reader, writer = conns.pop()
        head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        headers = await reader.readuntil(b"\r\n\r\n")
        size = 0
        if b"chunked" in headers.lower():
            while True:
                length = int((await reader.readuntil(b"\r\n"))[:-2], 16)
                data = await reader.readexactly(length + 2)
                size += length
                if length == 0:
                    break
                del data
        else:
            length = int(headers.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            size = len(await reader.readexactly(length))
        conns.append((reader, writer))
        return size

    async def plain() -> int:
        return await call(BODY_PLAIN)

    async def stream() -> int:
        return await call(BODY)

    result = {"non-streaming": await run(plain, n, c), "streaming": await run(stream, n, c)}
    for _, writer in conns:
        writer.close()
    return result


async def measure_provider(url: str, n: int, c: int) -> dict[str, float]:
    """The whole provider path: request translation, HTTP, SSE, pydantic, deltas."""
    config = BackendConfig(base_url=url.removesuffix("/chat/completions"), model="fake-model", max_connections=c)
    provider = OpenAICompatProvider(config)
    request = TurnRequest(model="", instructions="", items=[user_item("Say twenty words.")], tools=[])

    async def plain() -> int:
        return len((await provider.complete(request)).items) + 1

    async def stream() -> int:
        return len([event async for event in provider.stream(request)])

    try:
        return {"non-streaming": await run(plain, n, c), "streaming": await run(stream, n, c)}
    finally:
        await provider.aclose()


def user_item(text: str) -> pb.Item:
    part = pb.ContentPart(input_text=pb.InputText(text=text))
    return pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[part]))


def measure_parsing(n: int) -> dict[str, float]:
    chunk = json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": "word "}, "finish_reason": None}],
        }
    ).encode()
    results = {}
    for name, parse in {
        "pydantic model_validate_json": lambda: ChatCompletionChunk.model_validate_json(chunk),
        "orjson.loads + model_validate": lambda: ChatCompletionChunk.model_validate(orjson.loads(chunk)),
        "json.loads + model_validate": lambda: ChatCompletionChunk.model_validate(json.loads(chunk)),
    }.items():
        start = time.process_time()
        for _ in range(n):
            parse()
        results[name] = (time.process_time() - start) / n * 1e6
    return results


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()
    backend, url = start_backend()
    try:
        print(f"{args.requests} requests, concurrency {args.concurrency}, 20 text deltas per stream")
        print(f"{'client':<24}{'non-streaming':>14}{'streaming':>12}   (CPU µs per request)")
        for name, measure in [
            (f"httpx {httpx.__version__}", measure_httpx),
            (f"aiohttp {aiohttp.__version__}", measure_aiohttp),
            ("raw asyncio (floor)", measure_raw),
            ("our provider (aiohttp)", measure_provider),
        ]:
            figures = await measure(url, args.requests, args.concurrency)
            print(f"{name:<24}{figures['non-streaming']:>14.0f}{figures['streaming']:>12.0f}")
        print("\nparsing one chunk (CPU µs):")
        for name, micros in measure_parsing(20000).items():
            print(f"  {name:<32}{micros:>8.1f}")
    finally:
        backend.terminate()
        backend.wait()


if __name__ == "__main__":
    asyncio.run(main())
