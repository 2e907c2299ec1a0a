"""RequestErrors as the spec's error object, with the HTTP status of their gRPC code and the
offending parameter named by its JSON path (core paths name protobuf fields: translated here)."""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

import grpc
from aiohttp.http_exceptions import HttpProcessingError

from antwort_grpc.errors import RequestError
from antwort_grpc.http.jsonread import JSON

C = grpc.StatusCode
STATUS = {
    C.INVALID_ARGUMENT: 400,
    C.OUT_OF_RANGE: 400,
    C.UNAUTHENTICATED: 401,
    C.PERMISSION_DENIED: 403,
    C.NOT_FOUND: 404,
    C.ALREADY_EXISTS: 409,
    C.FAILED_PRECONDITION: 409,
    C.ABORTED: 409,
    C.RESOURCE_EXHAUSTED: 429,
    C.UNIMPLEMENTED: 501,
    C.UNAVAILABLE: 503,
    C.DEADLINE_EXCEEDED: 504,
}
# Refusals a retry cannot fix: the thing sent is too large, however long the client waits.
TOO_LARGE = frozenset({"control_too_large", "response_too_large"})
# The spec's error types (its table: invalid_request, not_found, too_many_requests, server_error,
# model_error): every other 4xx is a request the client can fix, so invalid_request; the `code`
# says which (invalid_api_key, not_in_progress …) and the status says the rest.
TYPES = {404: "not_found", 429: "too_many_requests"}


def error_type(status: int) -> str:
    """The spec's error type of an answer with `status`."""
    return TYPES.get(status, "server_error" if status >= 500 else "invalid_request")


# Protobuf field paths of the core's violations, and the JSON parameter each names.
_PARAM_RULES = [
    (re.compile(r"^input_items\.items"), "input"),
    (re.compile(r"^input_text$"), "input"),
    (re.compile(r"^conversation_id$"), "conversation"),
    (re.compile(r"^limits\."), ""),
    (re.compile(r"^tool_choice\.allowed_tools\.tool_names"), "tool_choice.tools"),
    (re.compile(r"^tool_choice\.(mode|allowed_tools)$"), "tool_choice"),
    (
        re.compile(
            r"\.(message|function_call_output|function_call|function|mcp|input_image|input_file|input_text|output_text"
            r"|item_reference|json_schema)(?=\.|\[|$)"
        ),
        "",
    ),
    (re.compile(r"\.approval_response\.call_id"), ".approval_request_id"),
    (re.compile(r"^tool_choice\.allowed_tools\."), "tool_choice."),
]


def param_of(field: str) -> str:
    """The JSON parameter a core field path names (`input_items.items[2].message.role` → `input[2].role`)."""
    for pattern, replacement in _PARAM_RULES:
        field = pattern.sub(replacement, field)
    return field


def http_status(error: RequestError) -> int:
    if error.code == C.RESOURCE_EXHAUSTED and error.reason in TOO_LARGE:
        return 413
    return STATUS.get(error.code, 500)


def error_json(error: RequestError, status: int | None = None) -> JSON:
    status = status or http_status(error)
    param = None
    if error.violations:
        param = param_of(error.violations[0].field) or None
    return {
        "error": {
            "type": error_type(status),
            "code": error.reason or None,
            "message": error.message,
            "param": param,
        }
    }


def plain_error(status: int, code: str, message: str, param: str | None = None) -> JSON:
    """An error the door itself finds (a body too large, not JSON, an unknown route)."""
    return {"error": {"type": error_type(status), "code": code, "message": message, "param": param}}


class _ServerLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server log (`aiohttp.server`), with a request aiohttp could not parse itself (a
    malformed request line, a header past its size) as one WARNING line: anyone can send such
    bytes, and aiohttp logs each as an ERROR with its traceback. Anything else is logged as aiohttp
    logs it."""

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        error = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if isinstance(error, HttpProcessingError):
            remote = args[0] if args else "?"
            # One line, whatever bytes the client sent: aiohttp's text may hold several.
            said = " ".join(error.message.encode("ascii", "backslashreplace").decode("ascii").split())[:200]
            self.warning("a malformed HTTP request from %s was refused (%s): %s", remote, error.code, said)
            return
        super().exception(msg, *args, exc_info=exc_info, **kwargs)

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return msg, kwargs


server_log: Any = _ServerLog(logging.getLogger("aiohttp.server"), {})
