"""RequestError -> a gRPC status with google.rpc details (BadRequest, ErrorInfo) in the trailers."""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from antwort_grpc.errors import RequestError

DOMAIN = "antwort.v1"


def to_status(err: RequestError) -> grpc.Status:
    details = []
    if err.violations:
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
                for v in err.violations
            ]
        )
        packed = any_pb2.Any()
        packed.Pack(bad)
        details.append(packed)
    if err.reason:
        packed = any_pb2.Any()
        packed.Pack(error_details_pb2.ErrorInfo(reason=err.reason, domain=DOMAIN))
        details.append(packed)
    status = status_pb2.Status(code=err.code.value[0], message=err.message, details=details)
    return rpc_status.to_status(status)


async def abort(context: Any, err: RequestError) -> None:
    await context.abort_with_status(to_status(err))
