"""The protobuf wire format where the gateway writes or reads messages by hand: events written
around bytes already serialized, and the top-level fields of a request read before it is parsed."""

from __future__ import annotations

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
