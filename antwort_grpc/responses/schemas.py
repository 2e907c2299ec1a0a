"""Is a function tool's `parameters` a usable JSON Schema? Answers are cached by schema.

A JSON Schema check costs about 2 ms of pure Python; clients send the same few schemas with every
request, so after the first request a check is a serialization and a dictionary lookup.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict

from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict
from jsonschema import exceptions as schema_errors
from jsonschema.validators import Draft202012Validator, validator_for

log = logging.getLogger(__name__)

# For a `$schema` jsonschema does not know (it would warn, and later versions refuse).
LATEST = Draft202012Validator

CACHE_SIZE = 4096

# Keyed by a digest of the serialized schema (and the depth limit), so the cache holds no schemas.
_cache: OrderedDict[tuple[bytes, int], str] = OrderedDict()
# Large requests are checked in worker threads.
_lock = threading.Lock()


def parameters_problem(parameters: struct_pb2.Struct, *, max_bytes: int, max_depth: int) -> str:
    """Why `parameters` cannot be a function's arguments schema ("" when it can)."""
    data = parameters.SerializeToString(deterministic=True)
    if len(data) > max_bytes:
        return f"at most {max_bytes} bytes serialized (this one is {len(data)})"
    key = (hashlib.blake2b(data, digest_size=16).digest(), max_depth)
    with _lock:
        verdict = _cache.get(key)
        if verdict is not None:
            _cache.move_to_end(key)
            return verdict
    verdict = _check(parameters, max_depth)
    with _lock:
        _cache[key] = verdict
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return verdict


def _check(parameters: struct_pb2.Struct, max_depth: int) -> str:
    try:
        schema = MessageToDict(parameters)
    except ValueError as err:
        if "NaN" in str(err) or "Infinity" in str(err):
            return "numbers must be finite (NaN and infinity are not JSON)"
        return f"not JSON: {err}"
    if _depth(schema, max_depth) > max_depth:
        return f"nested at most {max_depth} levels deep"
    return schema_problem(schema)


def _depth(value: object, limit: int, level: int = 0) -> int:
    """How deep objects and arrays nest in `value`; stops counting past `limit`."""
    if level > limit:
        return level
    children: list[object]
    if isinstance(value, dict):
        children = list(value.values())
    elif isinstance(value, list):
        children = value
    else:
        return level
    return max((_depth(child, limit, level + 1) for child in children), default=level + 1)


def schema_problem(schema: dict[str, object]) -> str:
    """Why `schema` is not a usable JSON Schema for function arguments ("" when it is)."""
    if schema.get("type", "object") != "object":
        return "the arguments schema must have type 'object'"
    if not isinstance(schema.get("$schema", ""), str):
        return "'$schema' must be a string (a meta-schema URI)"
    try:
        validator_for(schema, default=LATEST).check_schema(schema)
    except schema_errors.SchemaError as err:
        path = "/".join(str(p) for p in err.path)
        return f"not a valid JSON Schema: {err.message}" + (f" (at {path})" if path else "")
    except Exception as err:
        # The validator is third-party code fed untrusted input: whatever it trips over is the
        # schema's problem, not a failure of the gateway.
        log.debug("JSON Schema check failed", exc_info=True)
        return f"not a valid JSON Schema ({type(err).__name__})"
    return ""
