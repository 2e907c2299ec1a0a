"""google.protobuf.Struct -> plain Python values and JSON text, fast, the JSON cached.

json_format.MessageToDict walks a Struct through descriptors, field by field, in pure Python: 5 ms
for a 60 KiB schema, most of a second for the 128 a request may carry, and that on every model
call. `struct_to_dict` gives the same answer (numbers as floats, NaN and infinities refused with
ValueError) by the Value's oneof directly, in half the time; `struct_json` keeps the JSON text of
the schemas seen lately (by a digest of their serialization), so a schema is converted once: when
its request is checked, and no more for each model call that sends it."""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from google.protobuf import struct_pb2

# The JSON text kept, in characters: a few thousand typical schemas, or 500 at the size limit.
CACHE_CHARS = 32 * 1024 * 1024

V = TypeVar("V")


class DigestCache(Generic[V]):
    """What was made of Structs, by the `digest` of each, for every thread (requests are checked
    and bodies built in worker threads too): past `limit`, counted by `size` of each value, the
    least recently used go."""

    def __init__(self, limit: int, size: Callable[[V], int]) -> None:
        self.limit = limit
        self._size = size
        self._values: OrderedDict[bytes, V] = OrderedDict()
        self._total = 0
        self._lock = threading.Lock()

    def get(self, key: bytes) -> V | None:
        with self._lock:
            found = self._values.get(key)
            if found is not None:
                self._values.move_to_end(key)
            return found

    def put(self, key: bytes, value: V) -> None:
        """Keep `value` unless one is kept already (two threads made it at once)."""
        with self._lock:
            if key in self._values:
                return
            self._values[key] = value
            self._total += self._size(value)
            while self._total > self.limit and self._values:
                self._total -= self._size(self._values.popitem(last=False)[1])


_texts: DigestCache[str] = DigestCache(CACHE_CHARS, len)


def struct_to_dict(struct: struct_pb2.Struct) -> dict[str, Any]:
    """What json_format.MessageToDict(struct) returns; ValueError for a NaN or infinite number."""
    return {key: _value(value) for key, value in struct.fields.items()}


def _value(value: struct_pb2.Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "struct_value":
        return {key: _value(v) for key, v in value.struct_value.fields.items()}
    if kind == "number_value":
        number = value.number_value
        if number - number != 0:
            raise ValueError(f"{'NaN' if number != number else 'Infinity'} is not a JSON number")
        return number
    if kind == "list_value":
        return [_value(v) for v in value.list_value.values]
    if kind == "bool_value":
        return value.bool_value
    return None


def digest(data: bytes) -> bytes:
    """The cache's key of a Struct: a digest of its deterministic serialization."""
    return hashlib.blake2b(data, digest_size=16).digest()


def struct_json(struct: struct_pb2.Struct, key: bytes | None = None) -> str:
    """The JSON text of `struct` (json.dumps of struct_to_dict); `key`: its `digest`, when the
    caller has it. ValueError for a NaN or infinite number."""
    if key is None:
        key = digest(struct.SerializeToString(deterministic=True))
    text = _texts.get(key)
    if text is None:
        text = json.dumps(struct_to_dict(struct))
        _texts.put(key, text)
    return text


def remember(key: bytes, text: str) -> None:
    """Keep `text` as the JSON of the Struct whose digest is `key` (a caller that converted it)."""
    _texts.put(key, text)


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]")
_STEP = {"{": 1, "[": 1, "}": -1, "]": -1}


def json_depth(text: str) -> int:
    """How deep objects and arrays nest in a JSON text (`{}` is 1), counted at C speed."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0)


def integral(value: Any) -> Any:
    """`value` with its whole numbers as integers. A Struct holds every number as a double, so a
    schema's `"maxLength": 20` comes back as 20.0, which llama.cpp's schema-to-grammar converter
    refuses ("maxLength must be a non-negative integer") and error messages show as "0.0"."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {key: integral(item) for key, item in value.items()}
    if isinstance(value, list):
        return [integral(item) for item in value]
    return value
