"""Checks of a Control before it reaches a run: its shape and its size (pure). Whether it fits the
run's state (a call that awaits approval, a paused run, room in its queues) is the run's to say."""

from __future__ import annotations

import grpc

from antwort_grpc import pb
from antwort_grpc.errors import FieldViolation, RequestError, invalid_argument
from antwort_grpc.responses.request_limits import DEFAULT_LIMITS
from antwort_grpc.responses.validation import check_item


def check_control(control: pb.Control, max_items: int = DEFAULT_LIMITS.max_control_items) -> None:
    """RESOURCE_EXHAUSTED (control_too_large) for more items than a control may carry, counted
    before any of them is looked at; INVALID_ARGUMENT for a control of the wrong shape."""
    which = control.WhichOneof("control")
    if which in ("steer", "follow_up"):
        count = len(control.steer.items if which == "steer" else control.follow_up.items)
        if count > max_items:
            message = f"a {which} may carry at most {max_items} items, this one has {count}"
            raise RequestError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                message,
                [FieldViolation(f"control.{which}.items", message)],
                "control_too_large",
            )
    violations = validate_control(control, max_items=max_items)
    if violations:
        raise invalid_argument(violations)


def validate_control(
    control: pb.Control, at: str = "control", max_items: int = DEFAULT_LIMITS.max_control_items
) -> list[FieldViolation]:
    v: list[FieldViolation] = []
    which = control.WhichOneof("control")
    if which is None:
        v.append(FieldViolation(at, "required: one of steer, follow_up, approval, pause, resume, cancel"))
    elif which in ("steer", "follow_up"):
        items = control.steer.items if which == "steer" else control.follow_up.items
        if not items:
            v.append(FieldViolation(f"{at}.{which}.items", "must not be empty"))
        if len(items) > max_items:
            # Not walked: a control of a million items costs no more than its count.
            v.append(FieldViolation(f"{at}.{which}.items", f"at most {max_items} items"))
            return v
        for n, item in enumerate(items):
            where = f"{at}.{which}.items[{n}]"
            if item.WhichOneof("kind") != "message":
                v.append(FieldViolation(where, "only message items can be injected"))
                continue
            check_item(item, where, v)
    elif which == "approval" and not control.approval.call_id:
        v.append(FieldViolation(f"{at}.approval.call_id", "required"))
    return v
