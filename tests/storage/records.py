"""Responses to store in tests, built directly (no engine)."""

from __future__ import annotations

import os

from antwort_grpc import pb
from antwort_grpc.storage.base import StoredResponse

S = pb.ResponseStatus


def message(text: str, role: pb.Role = pb.Role.ROLE_USER, item_id: str = "") -> pb.Item:
    part = (
        pb.ContentPart(input_text=pb.InputText(text=text))
        if role == pb.Role.ROLE_USER
        else pb.ContentPart(output_text=pb.OutputText(text=text))
    )
    return pb.Item(
        id=item_id or "msg_" + os.urandom(4).hex(),
        status=pb.ItemStatus.ITEM_STATUS_COMPLETED,
        message=pb.Message(role=role, content=[part]),
    )


def record(
    response_id: str,
    *,
    status: int = S.RESPONSE_STATUS_COMPLETED,
    inputs: tuple[str, ...] = ("hello",),
    outputs: tuple[str, ...] = ("hi there",),
    previous: str = "",
    owner: str = "",
) -> StoredResponse:
    response = pb.Response(id=response_id, model="m", status=status, previous_response_id=previous)  # type: ignore[arg-type]
    response.created_at.FromSeconds(1_800_000_000)
    response.output.extend(message(text, pb.Role.ROLE_ASSISTANT) for text in outputs)
    return StoredResponse(response, [message(text) for text in inputs], owner)


def texts(items: list[pb.Item]) -> list[str]:
    return [p.input_text.text or p.output_text.text for i in items for p in i.message.content]
