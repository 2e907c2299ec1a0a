"""Rows of the durable stores: the Response and its input items as protobuf bytes, plus the few
columns queries filter on. Protobuf stays the data model; SQL only indexes it."""

from __future__ import annotations

import time
from dataclasses import dataclass

from antwort_grpc import pb
from antwort_grpc.storage.base import INTERRUPTED, StoredResponse
from antwort_grpc.storage.options import StoreOptions

S = pb.ResponseStatus
# Statuses of a response some gateway process is still working on.
RUNNING = (S.RESPONSE_STATUS_QUEUED, S.RESPONSE_STATUS_IN_PROGRESS)
_LENGTH = 4


@dataclass(frozen=True, slots=True)
class Row:
    id: str
    owner: str
    status: int
    previous_response_id: str
    created_at: float
    expires_at: float | None
    response: bytes
    input_items: bytes


def to_row(record: StoredResponse, options: StoreOptions) -> Row:
    response = record.response
    created = response.created_at.ToNanoseconds() / 1e9 if response.HasField("created_at") else options.clock()
    return Row(
        id=response.id,
        owner=record.owner,
        status=int(response.status),
        previous_response_id=response.previous_response_id,
        created_at=created,
        # The TTL runs from the last save: a response is kept that long after it ended.
        expires_at=options.expires_at(options.clock()),
        response=response.SerializeToString(),
        input_items=encode_items(record.input_items),
    )


def from_row(response: bytes, input_items: bytes, owner: str) -> StoredResponse:
    return StoredResponse(pb.Response.FromString(response), decode_items(input_items), owner)


def encode_items(items: list[pb.Item]) -> bytes:
    """Each item as a 4-byte big-endian length and its serialized bytes: one column per response,
    read back whole (inputs are bounded by the gRPC message size)."""
    parts: list[bytes] = []
    for item in items:
        data = item.SerializeToString()
        parts += [len(data).to_bytes(_LENGTH, "big"), data]
    return b"".join(parts)


def decode_items(data: bytes) -> list[pb.Item]:
    items: list[pb.Item] = []
    view = memoryview(data)
    at = 0
    while at < len(view):
        size = int.from_bytes(view[at : at + _LENGTH], "big")
        at += _LENGTH
        items.append(pb.Item.FromString(bytes(view[at : at + size])))
        at += size
    return items


def interrupted(response: bytes) -> bytes:
    """The response as FAILED/interrupted: what is left of one whose gateway process died."""
    message = pb.Response.FromString(response)
    message.status = S.RESPONSE_STATUS_FAILED
    message.error.code = INTERRUPTED
    message.error.message = "the gateway process running this response stopped before it finished"
    message.completed_at.FromNanoseconds(time.time_ns())
    for item in message.output:
        if item.status == pb.ItemStatus.ITEM_STATUS_IN_PROGRESS:
            item.status = pb.ItemStatus.ITEM_STATUS_INCOMPLETE
    return message.SerializeToString()
