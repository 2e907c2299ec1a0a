"""What the model backend is known not to serve, refused before a response is created.

A request naming a model the backend does not serve, forcing a tool call on a backend that
does not call tools, or showing images to one that reads text only, cannot succeed; refused here
it is a status (NOT_FOUND with google.rpc.ResourceInfo, INVALID_ARGUMENT with the field) before
`created`, not a response that is created and then fails. Only what the backend declares
(providers.base.Capabilities) is checked.
"""

from __future__ import annotations

import grpc

from antwort_grpc import pb
from antwort_grpc.errors import FieldViolation, RequestError, not_found
from antwort_grpc.providers.base import Capabilities, forces_a_call


def check_servable(request: pb.CreateResponseRequest, served: Capabilities, default_model: str) -> None:
    """Raise the RequestError for what `served` rules out of `request`."""
    model = request.model or default_model
    if served.models is not None and model and model not in served.models:
        names = ", ".join(repr(name) for name in sorted(served.models))
        raise not_found(
            "model",
            model,
            "model",
            f"{served.name} serves {names} only; name that, or none, or use {served.instead}",
            reason="model_not_found",
        )
    if not served.reads_images and (image := first_image(request)) is not None:
        description = f"{served.name} does not read images: send text only, or use {served.instead}"
        raise RequestError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{image}: {description}",
            [FieldViolation(image, description)],
            "image_unsupported",
        )
    choice = request.tool_choice if request.HasField("tool_choice") else None
    if not served.calls_tools and forces_a_call(choice):
        description = (
            f"{served.name} does not call tools, so a required or forced tool_choice cannot be honoured: "
            f"use tool_choice auto, or {served.instead}"
        )
        raise RequestError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"tool_choice: {description}",
            [FieldViolation("tool_choice", description)],
            "tool_choice_unsupported",
        )


def first_image(request: pb.CreateResponseRequest) -> str | None:
    """The field path of the request's first input image, if it has one."""
    if request.WhichOneof("input") != "input_items":
        return None
    for n, item in enumerate(request.input_items.items):
        if item.WhichOneof("kind") != "message":
            continue
        for m, part in enumerate(item.message.content):
            if part.WhichOneof("part") == "input_image":
                return f"input_items.items[{n}].message.content[{m}].input_image"
    return None
