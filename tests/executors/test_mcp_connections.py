"""The bridge's connections over time: servers that restart, exit, are down or never answer;
headers from config and files; tool lists that change; the bridge as a process."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from antwort_grpc import pb
from antwort_grpc.tool_services.mcp import McpServerConfig
from antwort_grpc.tool_services.mcp.config import HeaderFromFile
from tests.executors.mcp_harness import (
    SERVERS,
    execute,
    http_server,
    listed,
    mcp_tool,
    running_bridge,
    running_http_server,
    start_http_server,
    stdio_server,
)

ROOT = Path(__file__).resolve().parents[2]
# What "quickly" means for a server that is down: well under any model-facing timeout.
QUICKLY = 3.0


async def test_a_restarted_http_server_is_used_again_without_restarting_the_bridge() -> None:
    server = await start_http_server("tools")
    try:
        async with running_bridge([http_server("remote", server.url)]) as bridge:
            assert (await execute(bridge, "remote", "echo", text="before")).output == "before"

            await server.stop()
            started = time.monotonic()
            down = await execute(bridge, "remote", "echo", text="while down")
            assert down.is_error
            assert time.monotonic() - started < QUICKLY
            assert ("remote", "echo") in await listed(bridge), "the tools stay listed while the server is away"

            server = await start_http_server("tools", port=server.port)
            after = await execute(bridge, "remote", "echo", text="after")
            assert (after.output, after.is_error) == ("after", False)
    finally:
        await server.stop()


async def test_a_stdio_server_that_exits_mid_call_is_started_again() -> None:
    async with running_bridge([stdio_server("local")]) as bridge:
        first_pid = (await execute(bridge, "local", "pid")).output

        crashed = await execute(bridge, "local", "exit_now")
        assert crashed.is_error
        assert "lost the connection to MCP server 'local'" in crashed.output

        again = await execute(bridge, "local", "pid")
        assert not again.is_error
        assert again.output != first_pid


@pytest.mark.parametrize(
    "server",
    [
        http_server("gone", "http://127.0.0.1:9/mcp"),
        McpServerConfig(label="gone", transport="stdio", command="/nonexistent/mcp-server"),
    ],
    ids=["http", "stdio"],
)
async def test_a_server_that_is_down_yields_an_error_result_quickly(server: McpServerConfig) -> None:
    started = time.monotonic()
    async with running_bridge([server, stdio_server("local")]) as bridge:
        assert time.monotonic() - started < 10, "a server that is down must not hold up startup"
        assert {label for label, _ in await listed(bridge)} == {"local"}
        for _ in range(2):
            started = time.monotonic()
            outcome = await execute(bridge, "gone", "echo", text="hi")
            assert outcome.is_error
            assert "MCP server 'gone' is unavailable" in outcome.output
            assert time.monotonic() - started < QUICKLY
        assert not (await execute(bridge, "local", "echo", text="still here")).is_error


async def test_a_stdio_server_that_fails_at_startup_is_retried_with_backoff_not_in_a_loop(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    crashing = McpServerConfig(
        label="crashing", transport="stdio", command="/bin/sh", args=["-c", f"echo start >> {starts}; exit 1"]
    )
    async with running_bridge([crashing], reconnect_max_seconds=0.4) as bridge:
        # Watching a window of time is the point here: backoff 0.1, 0.2, 0.4, 0.4, … in 1.5 s.
        await asyncio.sleep(1.5)
        assert 3 <= starts.read_text().count("start") <= 8
        outcome = await execute(bridge, "crashing", "echo")
        assert outcome.is_error
        assert "MCP server 'crashing' is unavailable" in outcome.output


async def test_a_call_that_outlasts_the_call_timeout_is_an_error_result() -> None:
    async with running_bridge([stdio_server("local")], call_timeout=0.5) as bridge:
        outcome = await execute(bridge, "local", "sleep", seconds=60)
        assert outcome.is_error
        assert "tool 'sleep' on MCP server 'local' timed out after 0.5s" in outcome.output
        assert (await execute(bridge, "local", "echo", text="next")).output == "next"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_a_server_that_comes_up_after_the_bridge_started_is_claimed_at_once() -> None:
    port = free_port()
    # A long backoff: only the claim itself can connect in time.
    async with running_bridge(
        [http_server("late", f"http://127.0.0.1:{port}/mcp")], reconnect_max_seconds=60
    ) as bridge:
        claim = pb.CanExecuteRequest(tool=mcp_tool("late"))
        assert not (await bridge.CanExecute(claim)).can_execute
        server = await start_http_server("tools", port=port)
        try:
            assert (await bridge.CanExecute(claim, timeout=2)).can_execute
            assert ("late", "echo") in await listed(bridge)
            assert (await execute(bridge, "late", "echo", text="hello")).output == "hello"
        finally:
            await server.stop()


@pytest.fixture
async def silent_port() -> AsyncIterator[int]:
    """A port that accepts connections and never answers."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_a_server_that_never_answers_fails_within_the_connect_timeout(silent_port: int) -> None:
    silent = http_server("silent", f"http://127.0.0.1:{silent_port}/mcp")
    async with running_bridge([silent], connect_timeout=0.5) as bridge:
        started = time.monotonic()
        outcome = await execute(bridge, "silent", "echo", text="hi")
        assert outcome.is_error
        assert "MCP server 'silent' is unavailable: no answer in time" in outcome.output
        assert time.monotonic() - started < QUICKLY


async def test_headers_from_config_and_from_files_reach_the_http_server(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    async with running_http_server("tools", token="s3cret") as server:
        config = http_server(
            "remote",
            server.url,
            headers={"X-Tenant": "acme"},
            header_files={"Authorization": HeaderFromFile(path=token, prefix="Bearer ")},
        )
        async with running_bridge([config]) as bridge:
            seen = json.loads((await execute(bridge, "remote", "whoami")).output)
            assert seen == {"authorization": "Bearer s3cret", "x-tenant": "acme"}


async def test_a_server_that_refuses_the_credentials_is_unavailable(tmp_path: Path) -> None:
    async with running_http_server("tools", token="s3cret") as server:
        config = http_server("remote", server.url, headers={"Authorization": "Bearer wrong"})
        async with running_bridge([config]) as bridge:
            assert await listed(bridge) == []
            outcome = await execute(bridge, "remote", "echo", text="hi")
            assert outcome.is_error
            assert "MCP server 'remote' is unavailable" in outcome.output
            # The model is told what failed, not where the server is.
            address = server.url.split("//", 1)[1].split("/", 1)[0]
            assert address not in outcome.output, outcome.output


async def test_a_tool_the_server_added_later_is_listed_on_demand() -> None:
    async with running_bridge([stdio_server("local")]) as bridge:
        assert (await execute(bridge, "local", "learn", name="shout")).output == "learned shout"
        assert ("local", "shout") not in await listed(bridge)

        outcome = await execute(bridge, "local", "shout")
        assert (outcome.output, outcome.is_error) == ("I am shout", False)
        assert ("local", "shout") in await listed(bridge)


async def test_the_tool_list_is_refreshed_periodically() -> None:
    async with running_bridge([stdio_server("local")], refresh_seconds=0.1) as bridge:
        await execute(bridge, "local", "learn", name="whisper")
        # Nothing announces a refresh over gRPC: look the way a gateway does, by asking again.
        async with asyncio.timeout(10):
            while ("local", "whisper") not in await listed(bridge):  # noqa: ASYNC110
                await asyncio.sleep(0.05)


async def test_the_bridge_runs_as_a_process_from_the_cli(tmp_path: Path) -> None:
    config = tmp_path / "servers.json"
    config.write_text(
        json.dumps(
            {
                "servers": [
                    {
                        "label": "local",
                        "transport": "stdio",
                        "command": sys.executable,
                        "args": [str(SERVERS), "tools", "stdio"],
                    }
                ]
            }
        )
    )
    cli = [
        sys.executable,
        "-m",
        "antwort_grpc.cli",
        "executor",
        "mcp",
        "--listen",
        "127.0.0.1:0",
        "--config",
        str(config),
    ]
    proc = await asyncio.create_subprocess_exec(*cli, cwd=ROOT, env=dict(os.environ), stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        target = line.rsplit(" ", 1)[-1].strip()
        async with grpc.aio.insecure_channel(target) as channel:
            stub = pb.ToolExecutorServiceStub(channel)
            info = await stub.GetExecutorInfo(pb.GetExecutorInfoRequest())
            assert info.kind == pb.ToolKind.TOOL_KIND_MCP
            assert ("local", "echo") in [(t.server_label, t.function.name) for t in info.tools]
            assert (await execute(stub, "local", "echo", text="from the cli")).output == "from the cli"
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 20) == 0
