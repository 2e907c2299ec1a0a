"""Errors that end a request before its first event, each with the gRPC status it maps to."""

from __future__ import annotations

from dataclasses import dataclass

import grpc


@dataclass(frozen=True, slots=True)
class FieldViolation:
    field: str
    description: str


@dataclass(frozen=True, slots=True)
class Resource:
    """The thing a NOT_FOUND did not find, for google.rpc.ResourceInfo."""

    type: str
    name: str
    description: str = ""


class RequestError(Exception):
    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        violations: list[FieldViolation] | None = None,
        reason: str = "",
        resource: Resource | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.violations = violations or []
        # Machine-readable, for google.rpc.ErrorInfo.
        self.reason = reason
        self.resource = resource
        # Seconds the client should wait before it tries again (grpc-retry-pushback-ms and
        # google.rpc.RetryInfo); None: do not say.
        self.retry_after = retry_after


def invalid_argument(violations: list[FieldViolation]) -> RequestError:
    summary = "; ".join(f"{v.field}: {v.description}" for v in violations)
    return RequestError(grpc.StatusCode.INVALID_ARGUMENT, summary, violations, "invalid_request")


# ResourceInfo.resource_type of what a NOT_FOUND names (by the first word of `what`).
RESOURCE_TYPES = {
    "response": "antwort.v1.Response",
    "model": "model",
    "item": "antwort.v1.Item",
    "conversation": "antwort.v1.Conversation",
}


def not_found(what: str, ident: str, field: str = "", description: str = "", reason: str = "not_found") -> RequestError:
    """NOT_FOUND with google.rpc.ResourceInfo (type, name) and, given the field, BadRequest."""
    message = f"{what} {shorten(ident)!r} not found"
    if description:
        message += f": {description}"
    violations = [FieldViolation(field, message)] if field else []
    kind = RESOURCE_TYPES.get(what.split(" ", 1)[0], what)
    resource = Resource(kind, ident, description)
    return RequestError(grpc.StatusCode.NOT_FOUND, message, violations, reason, resource)


# How much of a client's value an error message repeats back.
ECHO_CHARS = 64


def shorten(text: str, limit: int = ECHO_CHARS) -> str:
    """`text`, cut to `limit` characters (marked with …): errors name what was sent without
    repeating a huge value back."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
