"""RequestError -> a gRPC status with google.rpc details (BadRequest, ErrorInfo, ResourceInfo) in the
trailers."""

from __future__ import annotations

import collections
from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from antwort_grpc.errors import FieldViolation, RequestError, shorten

DOMAIN = "antwort.v1"

# C-core clients (Python, C++, Ruby, PHP, …) drop a status whose trailers pass their metadata
# limit (8 KiB soft, 16 KiB hard by default) and report RESOURCE_EXHAUSTED instead of the error.
# The message travels twice (grpc-message, and inside the details) and the details grow by a third
# in base64, so a status is summarised to stay well below 8 KiB: the message cut, each violation
# cut, and the violations past the budget counted in one last entry.
MAX_MESSAGE_CHARS = 512
MAX_DETAILS_BYTES = 3072
MAX_FIELD_CHARS = 128
MAX_DESCRIPTION_CHARS = 256
# Room kept in the budget for the ErrorInfo, protobuf framing and the "… more" entry.
_RESERVED_BYTES = 256


# The trailer gRPC clients with a retry policy obey (gRFC A6): wait this many milliseconds.
RETRY_PUSHBACK_KEY = "grpc-retry-pushback-ms"


class _Status(collections.namedtuple("_Status", ("code", "details", "trailing_metadata")), grpc.Status):  # type: ignore[misc]
    pass


def to_status(err: RequestError) -> grpc.Status:
    message = shorten(err.message, MAX_MESSAGE_CHARS)
    resource = _resource_info(err)
    details = []
    if err.violations:
        budget = MAX_DETAILS_BYTES - _RESERVED_BYTES - len(message.encode())
        if resource is not None:
            budget -= resource.ByteSize()
        packed = any_pb2.Any()
        packed.Pack(_bad_request(err.violations, budget))
        details.append(packed)
    if err.reason:
        packed = any_pb2.Any()
        packed.Pack(error_details_pb2.ErrorInfo(reason=err.reason, domain=DOMAIN))
        details.append(packed)
    if resource is not None:
        packed = any_pb2.Any()
        packed.Pack(resource)
        details.append(packed)
    if err.retry_after is not None:
        packed = any_pb2.Any()
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(round(err.retry_after * 1000))
        packed.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        details.append(packed)
    status = rpc_status.to_status(status_pb2.Status(code=err.code.value[0], message=message, details=details))
    if err.retry_after is None:
        return status
    pushback = (RETRY_PUSHBACK_KEY, str(round(err.retry_after * 1000)))
    return _Status(status.code, status.details, (*status.trailing_metadata, pushback))


def _resource_info(err: RequestError) -> error_details_pb2.ResourceInfo | None:
    if err.resource is None:
        return None
    return error_details_pb2.ResourceInfo(
        resource_type=err.resource.type,
        resource_name=shorten(err.resource.name, MAX_FIELD_CHARS),
        description=shorten(err.resource.description, MAX_DESCRIPTION_CHARS),
    )


def _bad_request(violations: list[FieldViolation], budget: int) -> error_details_pb2.BadRequest:
    bad = error_details_pb2.BadRequest()
    for n, v in enumerate(violations):
        field = shorten(v.field, MAX_FIELD_CHARS)
        description = shorten(v.description, MAX_DESCRIPTION_CHARS)
        # Each entry costs its two strings plus a few bytes of tags and lengths.
        budget -= len(field.encode()) + len(description.encode()) + 8
        if budget < 0:
            bad.field_violations.add(description=f"… and {len(violations) - n} more problems")
            break
        bad.field_violations.add(field=field, description=description)
    return bad


async def abort(context: Any, err: RequestError) -> None:
    await context.abort_with_status(to_status(err))
