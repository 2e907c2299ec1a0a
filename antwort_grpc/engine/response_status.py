"""The response status state machine."""

from __future__ import annotations

import time

from antwort_grpc import pb
from antwort_grpc.engine.outcomes import Cancelled, Completed, Failed, FinalOutcome, Incomplete, RequiresAction

S = pb.ResponseStatus

_ALLOWED: dict[int, frozenset[int]] = {
    S.RESPONSE_STATUS_UNSPECIFIED: frozenset({S.RESPONSE_STATUS_QUEUED, S.RESPONSE_STATUS_IN_PROGRESS}),
    S.RESPONSE_STATUS_QUEUED: frozenset({S.RESPONSE_STATUS_IN_PROGRESS, S.RESPONSE_STATUS_CANCELLED}),
    S.RESPONSE_STATUS_IN_PROGRESS: frozenset(
        {
            S.RESPONSE_STATUS_COMPLETED,
            S.RESPONSE_STATUS_INCOMPLETE,
            S.RESPONSE_STATUS_FAILED,
            S.RESPONSE_STATUS_CANCELLED,
            S.RESPONSE_STATUS_REQUIRES_ACTION,
        }
    ),
}

TERMINAL: frozenset[int] = frozenset(
    {
        S.RESPONSE_STATUS_COMPLETED,
        S.RESPONSE_STATUS_INCOMPLETE,
        S.RESPONSE_STATUS_FAILED,
        S.RESPONSE_STATUS_CANCELLED,
        S.RESPONSE_STATUS_REQUIRES_ACTION,
    }
)


class InvalidTransition(ValueError):
    pass


def can_transition(current: int, new: int) -> bool:
    return new in _ALLOWED.get(current, frozenset())


def transition(current: int, new: int) -> int:
    """The new status, or InvalidTransition: terminal statuses have no way out."""
    if not can_transition(current, new):
        raise InvalidTransition(f"{S.Name(current)} -> {S.Name(new)}")
    return new


def end(response: pb.Response, outcome: FinalOutcome) -> None:
    """`response` as `outcome` leaves it: its final status (through the state machine), the error
    or the reason it is incomplete, and when it ended."""
    match outcome:
        case Completed():
            new_status = S.RESPONSE_STATUS_COMPLETED
        case RequiresAction():
            new_status = S.RESPONSE_STATUS_REQUIRES_ACTION
        case Incomplete(reason=reason):
            new_status = S.RESPONSE_STATUS_INCOMPLETE
            response.incomplete_details.reason = reason
        case Failed(code=code, message=message):
            new_status = S.RESPONSE_STATUS_FAILED
            response.error.code = code
            response.error.message = message
        case Cancelled():
            new_status = S.RESPONSE_STATUS_CANCELLED
    response.status = transition(response.status, new_status)  # type: ignore[assignment]
    response.completed_at.FromNanoseconds(time.time_ns())
