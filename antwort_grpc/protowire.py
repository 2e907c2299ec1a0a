"""The protobuf wire format where the gateway writes or reads messages by hand: events written
around bytes already serialized, the top-level fields of a request read before it is parsed, and a
large request parsed in pieces."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

M = TypeVar("M", bound=Message)
LENGTH_DELIMITED = 2


def varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def length_delimited(number: int, payload: bytes) -> bytes:
    """Field `number` holding `payload` (a message, bytes or a string) on the wire."""
    return varint(number << 3 | LENGTH_DELIMITED) + varint(len(payload)) + payload


def read_varint(raw: bytes, at: int) -> tuple[int, int]:
    """The varint at `at` and the position after it; position -1 when it is cut off or too long."""
    value = shift = 0
    while at < len(raw) and shift < 64:
        byte = raw[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
    return 0, -1


def next_field(raw: bytes, at: int) -> tuple[int, int, int]:
    """The field that starts at `at`: (its number, where a length-delimited payload starts or -1,
    the position after it). Number -1 when its tag cannot be read; position -1 (or past the end)
    when the field is cut off or of a wire type that cannot be skipped."""
    tag, at = read_varint(raw, at)
    if at < 0:
        return -1, -1, -1
    number, wire = tag >> 3, tag & 7
    if wire == 0:
        return number, -1, read_varint(raw, at)[1]
    if wire == 1:
        return number, -1, at + 8
    if wire == 5:
        return number, -1, at + 4
    if wire == LENGTH_DELIMITED:
        length, at = read_varint(raw, at)
        return number, at, (at + length if at >= 0 else -1)
    return number, -1, -1


# The bytes parsed in one call into C by `parse_in_pieces`: about 1-3 ms of parsing, the longest
# the event loop's thread then waits for the GIL behind it.
PIECE_BYTES = 128 * 1024


def parse_in_pieces(message_class: type[M], raw: bytes, piece: int = PIECE_BYTES) -> M:
    """`message_class.FromString(raw)`, parsed a piece of about `piece` bytes at a time.

    One call into C holds the GIL for the whole of what it parses: 8 MB of small items took a
    worker thread 100-400 ms, which every step of the event loop waited out. Parsed in pieces,
    the thread hands the GIL over between them. Protobuf merges what it parses into what it has
    (a repeated field appends), so consecutive top-level fields parsed together, and the fields
    inside a large singular message field (the input items) merged into it a group at a time,
    make what parsing the whole does. DecodeError as FromString's."""
    message = message_class()
    descriptor: Any = message_class.DESCRIPTOR
    start = at = 0
    while at < len(raw):
        number, payload, end = next_field(raw, at)
        if number <= 0 or end < 0 or end > len(raw):
            # Broken framing: the parser says what is wrong with the rest.
            break
        field = descriptor.fields_by_number.get(number)
        if end - at > piece and payload >= 0 and _splittable(field):
            if at > start:
                message.MergeFromString(raw[start:at])
            # Into the field's own message: merging it as a field of this one again would copy
            # what it holds each time.
            inner = getattr(message, field.name)
            inner.SetInParent()
            for group in _groups(raw, payload, end, piece):
                inner.MergeFromString(group)
            start = end
        elif end - start > piece and at > start:
            message.MergeFromString(raw[start:at])
            start = at
        at = end
    if start < len(raw):
        message.MergeFromString(raw[start:])
    return message


def _splittable(field: FieldDescriptor | None) -> bool:
    """A message field that may appear more than once and be merged: not repeated (each
    appearance would be another element), not a map entry."""
    return field is not None and field.message_type is not None and not field.is_repeated


def _groups(raw: bytes, at: int, end: int, piece: int) -> Iterator[bytes]:
    """The fields of the payload `raw[at:end]`, consecutive ones together, about `piece` bytes a group."""
    start = at
    while at < end:
        _, _, after = next_field(raw, at)
        if after < 0 or after > end:
            break
        if after - start > piece and at > start:
            yield raw[start:at]
            start = at
        at = after
    if start < end:
        yield raw[start:end]
