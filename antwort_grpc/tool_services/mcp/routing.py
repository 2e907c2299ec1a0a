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
    tool names. A call runs only a tool that the request named and its server lists:

    An `mcp` tool names its server. The call must be a tool that server lists (never a name it
    would run without listing it), and one of `allowed_tools` when the request gives them: the
    gateway filters what the model sees, but a model can still call a name it was not shown. An
    empty `allowed_tools` allows every tool the server lists.
    A function tool names one function: the call must have that name, and exactly one server must
    list it.
    """
    match tool.WhichOneof("kind"):
        case "mcp":
            label = tool.mcp.server_label
            if label not in listings:
                return Refused(f"no MCP server labelled {label!r} on this bridge")
            if tool.mcp.allowed_tools and call_name not in tool.mcp.allowed_tools:
                return Refused(f"tool {call_name!r} of MCP server {label!r} is not allowed for this request")
            # Nothing listed: the server is down; the connection answers that (and checks the
            # name against the listing it gets when the server is back).
            if listings[label] and call_name not in listings[label]:
                return Refused(f"MCP server {label!r} offers no tool named {call_name!r}")
            return label
        case "function":
            if call_name != tool.function.name:
                return Refused(f"tool {call_name!r} is not the function {tool.function.name!r} the request named")
            owners = [label for label, names in listings.items() if call_name in names]
            if len(owners) == 1:
                return owners[0]
            if not owners:
                return Refused(f"no MCP server on this bridge offers a tool named {call_name!r}")
            return Refused(f"tool {call_name!r} is offered by several MCP servers ({', '.join(owners)}); name one")
        case _:
            return Refused("the MCP bridge runs tools of kind mcp (or functions its servers offer)")
