"""The response status state machine."""

from __future__ import annotations

from antwort_grpc import pb

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
