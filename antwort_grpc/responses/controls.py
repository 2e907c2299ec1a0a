"""Checks of a Control before it reaches a run: its shape only (pure). Whether it fits the run's
state (a call that awaits approval, a paused run) is the run's to say."""

from __future__ import annotations

from antwort_grpc import pb
from antwort_grpc.errors import FieldViolation
from antwort_grpc.responses.validation import check_item


def validate_control(control: pb.Control, at: str = "control") -> list[FieldViolation]:
    v: list[FieldViolation] = []
    which = control.WhichOneof("control")
    if which is None:
        v.append(FieldViolation(at, "required: one of steer, follow_up, approval, pause, resume, cancel"))
    elif which in ("steer", "follow_up"):
        items = control.steer.items if which == "steer" else control.follow_up.items
        if not items:
            v.append(FieldViolation(f"{at}.{which}.items", "must not be empty"))
        for n, item in enumerate(items):
            where = f"{at}.{which}.items[{n}]"
            if item.WhichOneof("kind") != "message":
                v.append(FieldViolation(where, "only message items can be injected"))
                continue
            check_item(item, where, v)
    elif which == "approval" and not control.approval.call_id:
        v.append(FieldViolation(f"{at}.approval.call_id", "required"))
    return v
