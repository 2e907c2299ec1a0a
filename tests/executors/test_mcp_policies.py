"""The MCP bridge's pure parts, as tables: result mapping, progress text, routing, configuration."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from mcp import types as mt
from pydantic import ValidationError

from antwort_grpc import pb
from antwort_grpc.tool_services.mcp.config import McpBridgeSettings, McpServerConfig
from antwort_grpc.tool_services.mcp.connection import parse_arguments
from antwort_grpc.tool_services.mcp.results import executor_tool, function_output, progress_message
from antwort_grpc.tool_services.mcp.routing import Refused, route

PNG = base64.b64encode(b"12345678").decode()


def text(value: str) -> mt.TextContent:
    return mt.TextContent(text=value)


@pytest.mark.parametrize(
    ("result", "output", "is_error"),
    [
        (mt.CallToolResult(content=[text("hello")]), "hello", False),
        (mt.CallToolResult(content=[text("one"), text("two")]), "one\ntwo", False),
        # Text wins: servers mirror structured content as text (the SDK wraps plain values).
        (mt.CallToolResult(content=[text("42")], structured_content={"result": 42}), "42", False),
        # No text at all: the structured content is the output.
        (mt.CallToolResult(content=[], structured_content={"total": 3, "unit": "€"}), '{"total":3,"unit":"€"}', False),
        (mt.CallToolResult(content=[text("disk full")], is_error=True), "disk full", True),
        (mt.CallToolResult(content=[], is_error=True), "the tool reported an error without a message", True),
        (
            mt.CallToolResult(content=[mt.ImageContent(data=PNG, mime_type="image/png")]),
            "[image: image/png, 8 bytes]",
            False,
        ),
        (
            mt.CallToolResult(content=[mt.AudioContent(data=PNG, mime_type="audio/wav")]),
            "[audio: audio/wav, 8 bytes]",
            False,
        ),
        (
            mt.CallToolResult(content=[mt.ResourceLink(name="log", uri="file:///var/log/app.log")]),
            "[resource link: log file:///var/log/app.log]",
            False,
        ),
        (
            mt.CallToolResult(
                content=[mt.EmbeddedResource(resource=mt.TextResourceContents(uri="mem://a", text="inline text"))]
            ),
            "inline text",
            False,
        ),
        (
            mt.CallToolResult(
                content=[
                    mt.EmbeddedResource(resource=mt.BlobResourceContents(uri="mem://b", blob=PNG, mime_type="x/y"))
                ],
                structured_content={"ok": True},
            ),
            '{"ok":true}\n[resource: mem://b (x/y), 8 bytes]',
            False,
        ),
    ],
    ids=[
        "text",
        "texts",
        "text-and-structured",
        "structured-only",
        "error",
        "error-without-text",
        "image",
        "audio",
        "resource-link",
        "embedded-text",
        "embedded-blob-and-structured",
    ],
)
def test_mcp_results_map_to_one_text_output(result: mt.CallToolResult, output: str, is_error: bool) -> None:
    mapped = function_output(result)
    assert (mapped.output, mapped.is_error) == (output, is_error)


@pytest.mark.parametrize(
    ("progress", "total", "message", "text"),
    [
        (1, 3, "step 1", "step 1 (1/3)"),
        (0.5, None, "halfway", "halfway (0.5)"),
        (2, 10, None, "progress 2/10"),
        (7, None, None, "progress 7"),
    ],
)
def test_progress_notifications_read_as_one_line(
    progress: float, total: float | None, message: str | None, text: str
) -> None:
    assert progress_message(progress, total, message) == text


def test_an_mcp_tool_keeps_its_name_schema_and_server_label() -> None:
    tool = mt.Tool(name="search.docs", title="Search", input_schema={"type": "object", "required": ["q"]})
    mapped = executor_tool(tool, "docs")
    assert (mapped.server_label, mapped.function.name, mapped.function.description) == ("docs", "search.docs", "Search")
    assert list(mapped.function.parameters["required"]) == ["q"]


LISTINGS = {"github": {"search", "create_issue"}, "docs": {"search", "fetch"}, "down": set()}


def mcp(label: str, *allowed: str) -> pb.Tool:
    return pb.Tool(mcp=pb.McpTool(server_label=label, allowed_tools=list(allowed)))


def function(name: str) -> pb.Tool:
    return pb.Tool(function=pb.FunctionTool(name=name))


@pytest.mark.parametrize(
    ("call", "tool", "expected"),
    [
        ("search", mcp("github"), "github"),
        ("search", mcp("docs"), "docs"),
        ("create_issue", mcp("github", "create_issue"), "github"),
        ("search", mcp("github", "create_issue"), Refused("tool 'search' of MCP server 'github' is not allowed")),
        # A server that is down (nothing listed) still gets the call: it answers "unavailable".
        ("anything", mcp("down"), "down"),
        ("search", mcp("gitlab"), Refused("no MCP server labelled 'gitlab'")),
        # Only what the server lists: not a name it would run without listing it.
        ("admin_reset", mcp("github"), Refused("MCP server 'github' offers no tool named 'admin_reset'")),
        # A function tool names one function: the call must be that one.
        ("create_issue", function("fetch"), Refused("not the function 'fetch' the request named")),
        ("fetch", function("fetch"), "docs"),
        ("search", function("search"), Refused("offered by several MCP servers (github, docs)")),
        ("translate", function("translate"), Refused("no MCP server on this bridge offers a tool named 'translate'")),
        ("run", pb.Tool(code_interpreter=pb.CodeInterpreterTool()), Refused("the MCP bridge runs tools of kind mcp")),
    ],
)
def test_a_call_is_routed_to_the_server_its_tool_names(call: str, tool: pb.Tool, expected: str | Refused) -> None:
    routed = route(call, tool, LISTINGS)
    if isinstance(expected, Refused):
        assert isinstance(routed, Refused)
        assert expected.reason in routed.reason
    else:
        assert routed == expected


@pytest.mark.parametrize(
    ("arguments", "parsed"), [("", {}), ("  ", {}), ("{}", {}), ('{"q": "x", "n": 2}', {"q": "x", "n": 2})]
)
def test_arguments_are_a_json_object(arguments: str, parsed: dict[str, object]) -> None:
    assert parse_arguments(arguments) == parsed


@pytest.mark.parametrize("arguments", ["[1]", '"text"', "{not json"])
def test_arguments_that_are_not_a_json_object_are_refused(arguments: str) -> None:
    with pytest.raises(ValueError):
        parse_arguments(arguments)


def test_servers_come_from_the_config_file_and_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = tmp_path / "token"
    token.write_text("abc\n")
    config = tmp_path / "servers.json"
    config.write_text(
        json.dumps(
            {
                "servers": [
                    {"label": "files", "transport": "stdio", "command": "mcp-files", "args": ["--root", "/data"]},
                    {
                        "label": "github",
                        "transport": "streamable_http",
                        "url": "https://mcp.example/mcp",
                        "headers": {"X-Tenant": "acme"},
                        "header_files": {
                            "Authorization": {"path": str(token), "prefix": "Bearer "},
                            "X-Key": str(token),
                        },
                    },
                ]
            }
        )
    )
    monkeypatch.setenv("ANTWORT_MCP_CONFIG", str(config))
    monkeypatch.setenv(
        "ANTWORT_MCP_SERVERS", '[{"label": "docs", "transport": "streamable_http", "url": "http://docs/mcp"}]'
    )
    monkeypatch.setenv("ANTWORT_MCP_CALL_TIMEOUT", "12.5")
    settings = McpBridgeSettings()
    servers = settings.load_servers()
    assert [s.label for s in servers] == ["files", "github", "docs"]
    assert servers[0].args == ["--root", "/data"]
    assert servers[1].resolved_headers() == {"X-Tenant": "acme", "Authorization": "Bearer abc", "X-Key": "abc"}
    assert settings.call_timeout == 12.5


def test_a_config_file_may_be_a_plain_list(tmp_path: Path) -> None:
    config = tmp_path / "servers.json"
    config.write_text('[{"label": "files", "transport": "stdio", "command": "mcp-files"}]')
    assert [s.label for s in McpBridgeSettings(config=config).load_servers()] == ["files"]


def test_server_labels_must_be_unique() -> None:
    twice = [{"label": "a", "transport": "stdio", "command": "x"}] * 2
    with pytest.raises(ValueError, match="repeated: a"):
        McpBridgeSettings.model_validate({"servers": twice}).load_servers()


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"label": "a", "transport": "stdio"}, "stdio needs a command"),
        ({"label": "a", "transport": "stdio", "command": "x", "url": "http://h/mcp"}, "streamable_http only"),
        ({"label": "a", "transport": "streamable_http"}, "needs an http(s) url"),
        ({"label": "a", "transport": "streamable_http", "url": "ftp://h"}, "needs an http(s) url"),
        ({"label": "a", "transport": "streamable_http", "url": "http://h", "command": "x"}, "stdio only"),
        ({"label": "a b", "transport": "stdio", "command": "x"}, "String should match pattern"),
        ({"label": "a", "transport": "sse", "url": "http://h"}, "Input should be 'stdio' or 'streamable_http'"),
    ],
)
def test_a_server_config_that_cannot_work_is_rejected_at_startup(fields: dict[str, object], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        McpServerConfig.model_validate(fields)
