"""Rows of the durable stores: the Response and its input items as protobuf bytes, plus the few
columns queries filter on. Protobuf stays the data model; SQL only indexes it."""

from __future__ import annotations

import time
from dataclasses import dataclass

from antwort_grpc import pb
from antwort_grpc.storage.base import INTERRUPTED, RUNNING, ItemPage, StoredResponse
from antwort_grpc.storage.options import StoreOptions

# The running statuses as an SQL list, so queries match the partial indexes of migrations.py.
RUNNING_SQL = "(" + ", ".join(str(s) for s in sorted(RUNNING)) + ")"
FAILED = int(pb.ResponseStatus.RESPONSE_STATUS_FAILED)
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
    # The ids of its items, once it has ended: what item references find it by.
    item_ids: tuple[str, ...] = ()


def indexed_ids(record: StoredResponse) -> tuple[str, ...]:
    """The ids an ended response is found by (its input and output items; none while it runs:
    an item is referable once its response has ended)."""
    if record.response.status in RUNNING:
        return ()
    ids = dict.fromkeys(item.id for item in record.input_items)
    ids.update(dict.fromkeys(item.id for item in record.response.output))
    ids.pop("", None)
    return tuple(ids)


def find_item(record: StoredResponse, item_id: str) -> pb.Item | None:
    """The item of `record` with this id: an output item, else an input item."""
    for item in record.response.output:
        if item.id == item_id:
            return item
    for item in record.input_items:
        if item.id == item_id:
            return item
    return None


def to_row(record: StoredResponse, options: StoreOptions, *, index: bool = True) -> Row:
    """`index`: with the ids an item reference finds the response by (indexed_ids)."""
    response = record.response
    now = options.clock()
    created = response.created_at.ToNanoseconds() / 1e9 if response.HasField("created_at") else now
    return Row(
        id=response.id,
        owner=record.owner,
        status=int(response.status),
        previous_response_id=response.previous_response_id,
        created_at=created,
        # The TTL runs from the last save: a response is kept that long after it ended.
        expires_at=options.expires_at(now),
        response=response.SerializeToString(),
        input_items=encode_items(record.input_items),
        item_ids=indexed_ids(record) if index else (),
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


def mark_interrupted(response: pb.Response) -> None:
    """What is left of a response whose gateway process stopped: FAILED/interrupted, with the
    output it had at its last save and unfinished items marked incomplete."""
    response.status = pb.ResponseStatus.RESPONSE_STATUS_FAILED
    response.error.code = INTERRUPTED
    response.error.message = "the gateway process running this response stopped before it finished"
    response.completed_at.FromNanoseconds(time.time_ns())
    for item in response.output:
        if item.status == pb.ItemStatus.ITEM_STATUS_IN_PROGRESS:
            item.status = pb.ItemStatus.ITEM_STATUS_INCOMPLETE


def interrupted(response: bytes) -> bytes:
    message = pb.Response.FromString(response)
    mark_interrupted(message)
    return message.SerializeToString()


def page_items(items: list[pb.Item], *, limit: int, after: str, descending: bool) -> ItemPage:
    """Cursor pagination over a response's input items (stored whole, so paged in memory).
    An `after` id that is not among the items gives an empty page."""
    ordered = list(reversed(items)) if descending else items
    start = 0
    if after:
        for i, item in enumerate(ordered):
            if item.id == after:
                start = i + 1
                break
        else:
            return ItemPage([], False)
    return ItemPage(ordered[start : start + limit], start + limit < len(ordered))


class InputItemsInTheRow:
    """`list_input_items` of a durable store: the input items are stored whole in the response's
    row, so a page is cut from the record `get` reads."""

    async def get(self, response_id: str, owner: str = "") -> StoredResponse | None:
        raise NotImplementedError

    async def list_input_items(
        self, response_id: str, *, limit: int, after: str, descending: bool, owner: str = ""
    ) -> ItemPage | None:
        record = await self.get(response_id, owner)
        if record is None:
            return None
        return page_items(record.input_items, limit=limit, after=after, descending=descending)
