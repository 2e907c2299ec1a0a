"""A complete hook service: deny one tool by name, redact e-mail addresses from every tool result.

    antwort-grpc hook run examples.redact_hook:DenyAndRedact --listen 127.0.0.1:50071
    antwort-grpc serve --hook "127.0.0.1:50071;failure=closed"

ANTWORT_DENIED_TOOLS (comma-separated, default `delete_user`) names the tools it denies.
"""

from __future__ import annotations

import os
import re

from antwort_grpc import pb
from antwort_grpc.hooks import PolicyHook

EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
REDACTED = "[redacted e-mail]"


class DenyAndRedact(PolicyHook):
    name = "deny-and-redact"

    def __init__(self) -> None:
        denied = os.environ.get("ANTWORT_DENIED_TOOLS", "delete_user")
        self.denied = {name.strip() for name in denied.split(",") if name.strip()}

    async def before_tool(self, request: pb.BeforeToolRequest) -> pb.BeforeToolResponse:
        if request.call.name in self.denied:
            return pb.BeforeToolResponse(deny_reason=f"{request.call.name} is not allowed here")
        return pb.BeforeToolResponse()

    async def after_tool(self, request: pb.AfterToolRequest) -> pb.AfterToolResponse:
        redacted = EMAIL.sub(REDACTED, request.result.output)
        if redacted == request.result.output:
            return pb.AfterToolResponse()
        result = pb.FunctionCallOutput()
        result.CopyFrom(request.result)
        result.output = redacted
        return pb.AfterToolResponse(result=result)
