"""The controls of a response in progress over HTTP (our extension, docs/http.md):
`POST /v1/responses/{id}/{name}` for each control of the core's registry (front.CONTROLS), its
JSON body decoded here. `cancel` is the spec's own route."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from antwort_grpc import pb
from antwort_grpc.front import CONTROLS
from antwort_grpc.http.jsonread import bad, boolean, string
from antwort_grpc.http.mapping import item_from_json


def _items(body: dict[str, Any]) -> list[pb.Item]:
    value = body.get("input")
    if isinstance(value, str):
        part = pb.ContentPart(input_text=pb.InputText(text=value))
        return [pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[part]))]
    if not isinstance(value, list):
        raise bad("input", "required: a string, or an array of input items")
    return [item_from_json(entry, f"input[{n}]") for n, entry in enumerate(value)]


def _steer(body: dict[str, Any]) -> pb.Control:
    return pb.Control(steer=pb.SteerControl(items=_items(body)))


def _follow_up(body: dict[str, Any]) -> pb.Control:
    return pb.Control(follow_up=pb.FollowUpControl(items=_items(body)))


def _approval(body: dict[str, Any]) -> pb.Control:
    decision = pb.ApprovalResponse(
        call_id=string(body.get("approval_request_id"), "approval_request_id"),
        approve=boolean(body.get("approve"), "approve"),
        reason=string(body.get("reason", ""), "reason"),
    )
    return pb.Control(approval=decision)


def _pause(body: dict[str, Any]) -> pb.Control:
    return pb.Control(pause=pb.PauseControl(reason=string(body.get("reason", ""), "reason")))


def _resume(body: dict[str, Any]) -> pb.Control:
    return pb.Control(resume=pb.ResumeControl())


# The spec's route serves it (POST /v1/responses/{id}/cancel, answered with the response).
SPEC_ROUTES = frozenset({"cancel"})

DECODERS: dict[str, Callable[[dict[str, Any]], pb.Control]] = {
    "steer": _steer,
    "follow_up": _follow_up,
    "approval": _approval,
    "pause": _pause,
    "resume": _resume,
}

# Routed by the core's registry: a control this door cannot decode is a KeyError at import.
ROUTED = {name: DECODERS[name] for name in CONTROLS if name not in SPEC_ROUTES}
