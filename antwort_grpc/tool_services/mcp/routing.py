"""Which configured MCP server a call goes to: a pure decision over the request's tool and the
servers' listings."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from antwort_grpc import pb


@dataclass(frozen=True)
class Refused:
    """The call is not run; the reason goes back to the model as an is_error result."""

    reason: str


def route(call_name: str, tool: pb.Tool, listings: Mapping[str, Collection[str]]) -> str | Refused:
    """The server label for a call, given the Tool it was routed by and each configured server's
    tool names.

    An `mcp` tool names its server; its `allowed_tools`, when set, are enforced here too (the
    gateway filters what the model sees, but a model can still call a name it was not shown).
    A function tool is claimed by name: exactly one server must list it.
    """
    match tool.WhichOneof("kind"):
        case "mcp":
            label = tool.mcp.server_label
            if label not in listings:
                return Refused(f"no MCP server labelled {label!r} on this bridge")
            if tool.mcp.allowed_tools and call_name not in tool.mcp.allowed_tools:
                return Refused(f"tool {call_name!r} of MCP server {label!r} is not allowed for this request")
            return label
        case "function":
            owners = [label for label, names in listings.items() if call_name in names]
            if len(owners) == 1:
                return owners[0]
            if not owners:
                return Refused(f"no MCP server on this bridge offers a tool named {call_name!r}")
            return Refused(f"tool {call_name!r} is offered by several MCP servers ({', '.join(owners)}); name one")
        case _:
            return Refused("the MCP bridge runs tools of kind mcp (or functions its servers offer)")
