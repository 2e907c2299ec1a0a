"""Pure conversions between MCP's shapes and ours: tools, results, progress."""

from __future__ import annotations

import json

from mcp import types as mt

from antwort_grpc import pb
from antwort_grpc.tool_services.sdk import function_tool


def executor_tool(tool: mt.Tool, server_label: str) -> pb.ExecutorTool:
    """An MCP tool as the model sees it: its own name, its description (or title), its input
    schema, tagged with the server it comes from."""
    return function_tool(tool.name, tool.description or tool.title or "", tool.input_schema, server_label)


def function_output(result: mt.CallToolResult) -> pb.FunctionCallOutput:
    """A tool result as one text output for the model.

    The text blocks are what the model reads. Structured content is for programs, and the MCP
    spec asks servers to mirror it in a text block, so it is used (as compact JSON) only when
    the result has no text at all. Content the model cannot read here (images, audio, binary
    resources, links) is described in brackets rather than dropped silently.
    """
    parts: list[str] = []
    has_text = False
    for block in result.content:
        match block:
            case mt.TextContent(text=text) | mt.EmbeddedResource(resource=mt.TextResourceContents(text=text)):
                parts.append(text)
                has_text = True
            case mt.ImageContent(mime_type=mime, data=data):
                parts.append(f"[image: {mime}, {_decoded_size(data)} bytes]")
            case mt.AudioContent(mime_type=mime, data=data):
                parts.append(f"[audio: {mime}, {_decoded_size(data)} bytes]")
            case mt.ResourceLink():
                parts.append(f"[resource link: {block.name} {block.uri}{_mime(block.mime_type)}]")
            case mt.EmbeddedResource(resource=mt.BlobResourceContents() as blob):
                parts.append(f"[resource: {blob.uri}{_mime(blob.mime_type)}, {_decoded_size(blob.blob)} bytes]")
            case _:
                parts.append(f"[{getattr(block, 'type', type(block).__name__)} content]")
    if not has_text and result.structured_content is not None:
        parts.insert(0, json.dumps(result.structured_content, ensure_ascii=False, separators=(",", ":")))
    output = "\n".join(parts)
    if result.is_error and not output:
        output = "the tool reported an error without a message"
    return pb.FunctionCallOutput(output=output, is_error=result.is_error)


def progress_message(progress: float, total: float | None, message: str | None) -> str:
    """An MCP progress notification as one line: "message (2/5)"."""
    amount = f"{progress:g}/{total:g}" if total is not None else f"{progress:g}"
    return f"{message} ({amount})" if message else f"progress {amount}"


def _decoded_size(base64_data: str) -> int:
    stripped = base64_data.rstrip("=")
    return len(stripped) * 3 // 4


def _mime(mime_type: str | None) -> str:
    return f" ({mime_type})" if mime_type else ""
