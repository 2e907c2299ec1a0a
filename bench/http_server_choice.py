"""Which HTTP server library the Open Responses door runs on: the server process's CPU per small
JSON request and per SSE event, aiohttp's server against Starlette on uvicorn (httptools), the
same handlers, one client process. Run: `python -m bench.http_server_choice` (docs/http.md)."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import socket
import sys
import time

REQUESTS = 2000
STREAMS = 40
EVENTS = 500
BODY = {"model": "m", "input": "hello"}
EVENT = json.dumps(
    {
        "type": "response.output_text.delta",
        "sequence_number": 7,
        "item_id": "msg_1",
        "output_index": 0,
        "content_index": 0,
        "delta": "word ",
    }
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_aiohttp(port: int) -> None:
    from aiohttp import web

    async def small(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"id": "resp_1", "object": "response", "model": body["model"]})

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(EVENTS):
            await response.write(f"event: response.output_text.delta\ndata: {EVENT}\n\n".encode())
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/small", small)
    app.router.add_post("/stream", stream)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def serve_starlette(port: int) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def small(request: Request) -> JSONResponse:
        body = await request.json()
        return JSONResponse({"id": "resp_1", "object": "response", "model": body["model"]})

    async def stream(request: Request) -> StreamingResponse:
        async def events():  # type: ignore[no-untyped-def]
            for _ in range(EVENTS):
                yield f"event: response.output_text.delta\ndata: {EVENT}\n\n".encode()

        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/small", small, methods=["POST"]), Route("/stream", stream, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, http="httptools", loop="asyncio", log_level="error", access_log=False)


def cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(port: int, pid: int) -> tuple[float, float]:
    import aiohttp

    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session:
        for _ in range(100):
            async with session.post("/small", json=BODY) as r:
                await r.read()
        before = cpu_of(pid)
        for _ in range(REQUESTS // 8):
            await asyncio.gather(*(_small(session) for _ in range(8)))
        per_request = (cpu_of(pid) - before) / REQUESTS
        before = cpu_of(pid)
        for _ in range(STREAMS // 4):
            await asyncio.gather(*(_stream(session) for _ in range(4)))
        per_event = (cpu_of(pid) - before) / (STREAMS * EVENTS)
    return per_request, per_event


async def _small(session) -> None:  # type: ignore[no-untyped-def]
    async with session.post("/small", json=BODY) as r:
        await r.read()


async def _stream(session) -> None:  # type: ignore[no-untyped-def]
    async with session.post("/stream", json=BODY) as r:
        async for _line in r.content:
            pass


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    results: dict[str, list[tuple[float, float]]] = {"aiohttp": [], "starlette+uvicorn": []}
    for _ in range(rounds):
        for name, target in (("aiohttp", serve_aiohttp), ("starlette+uvicorn", serve_starlette)):
            port = _free_port()
            process = multiprocessing.Process(target=target, args=(port,), daemon=True)
            process.start()
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                    break
                except OSError:
                    time.sleep(0.05)
            assert process.pid is not None
            results[name].append(asyncio.run(measure(port, process.pid)))
            process.terminate()
            process.join()
    for name, figures in results.items():
        request = min(f[0] for f in figures) * 1e6
        event = min(f[1] for f in figures) * 1e6
        print(f"{name:18s} {request:7.0f} µs CPU per small JSON request, {event:5.1f} µs per SSE event")


if __name__ == "__main__":
    main()
