"""Errors that end a request before its first event, each with the gRPC status it maps to."""

from __future__ import annotations

from dataclasses import dataclass

import grpc


@dataclass(frozen=True, slots=True)
class FieldViolation:
    field: str
    description: str


class RequestError(Exception):
    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        violations: list[FieldViolation] | None = None,
        reason: str = "",
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.violations = violations or []
        # Machine-readable, for google.rpc.ErrorInfo.
        self.reason = reason
        # Seconds the client should wait before it tries again (grpc-retry-pushback-ms and
        # google.rpc.RetryInfo); None: do not say.
        self.retry_after = retry_after


def invalid_argument(violations: list[FieldViolation]) -> RequestError:
    summary = "; ".join(f"{v.field}: {v.description}" for v in violations)
    return RequestError(grpc.StatusCode.INVALID_ARGUMENT, summary, violations, "invalid_request")


def not_found(what: str, ident: str, field: str = "") -> RequestError:
    message = f"{what} {shorten(ident)!r} not found"
    violations = [FieldViolation(field, message)] if field else []
    return RequestError(grpc.StatusCode.NOT_FOUND, message, violations, "not_found")


# How much of a client's value an error message repeats back.
ECHO_CHARS = 64


def shorten(text: str, limit: int = ECHO_CHARS) -> str:
    """`text`, cut to `limit` characters (marked with …): errors name what was sent without
    repeating a huge value back."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
