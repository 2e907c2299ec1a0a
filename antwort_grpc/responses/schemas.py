"""Is a function tool's `parameters` a usable JSON Schema? Answers are cached by schema.

The check against the meta-schema runs in Rust (jsonschema-rs): for a 60 KiB schema of a few
hundred properties about 0.3 ms, where the pure-Python jsonschema took 340 ms — the difference
between a request at the limits costing 0.05 s and 40 s of CPU. Clients send the same few schemas
with every request, so after the first request a check is a serialization and a dictionary lookup.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import jsonschema_rs
from google.protobuf import struct_pb2
from jsonschema.validators import Draft4Validator, Draft6Validator, Draft7Validator, Draft201909Validator
from jsonschema.validators import Draft202012Validator as Latest

from antwort_grpc.engine.output_format import compile_schema
from antwort_grpc.errors import shorten
from antwort_grpc.offload import in_process
from antwort_grpc.structs import digest, json_depth, remember, struct_to_dict

log = logging.getLogger(__name__)


def _meta_validator(validator: Any) -> Any:
    # Built from the meta-schema itself (not from the schema's `$schema`): a `$schema` the
    # validator does not know is never fetched, it is only a string.
    return jsonschema_rs.validator_for(validator.META_SCHEMA, validate_formats=True)


# The drafts a `$schema` may name; any other (or none) is checked as the latest.
_DRAFTS = {
    v.META_SCHEMA["$schema"].rstrip("#"): v
    for v in (Draft4Validator, Draft6Validator, Draft7Validator, Draft201909Validator, Latest)
}
_META: dict[str, Any] = {}
_meta_lock = threading.Lock()


def _meta_for(uri: object) -> Any:
    draft = _DRAFTS.get(uri.rstrip("#") if isinstance(uri, str) else "", Latest)
    key = draft.META_SCHEMA["$schema"]
    with _meta_lock:
        meta = _META.get(key)
        if meta is None:
            meta = _META[key] = _meta_validator(draft)
    return meta


CACHE_SIZE = 4096

# Keyed by a digest of the serialized schema, the depth limit and whether it is an arguments
# schema (a tool's, which must describe an object), so the cache holds no schemas.
_Key = tuple[bytes, int, bool]
_cache: OrderedDict[_Key, str] = OrderedDict()
# Large requests are checked in worker threads.
_lock = threading.Lock()


def parameters_problem(parameters: struct_pb2.Struct, *, max_bytes: int, max_depth: int) -> str:
    """Why `parameters` cannot be a function's arguments schema ("" when it can)."""
    return parameters_problems([parameters], max_bytes=max_bytes, max_depth=max_depth)[0]


def format_schema_problem(schema: struct_pb2.Struct, *, max_bytes: int, max_depth: int) -> str:
    """Why `schema` cannot be a text format's JSON Schema ("" when it can): the limits of a tool's
    parameters, but any type of value may be asked for."""
    return parameters_problems([schema], max_bytes=max_bytes, max_depth=max_depth, arguments=False)[0]


# Schemas not seen before, this many bytes of them or more together, are checked in the worker
# process when the caller may wait for it (`in_worker`): about 40 ms of Python walking them.
IN_PROCESS_BYTES = 256 * 1024


def parameters_problems(
    schemas: Sequence[struct_pb2.Struct],
    *,
    max_bytes: int,
    max_depth: int,
    in_worker: bool = False,
    arguments: bool = True,
) -> list[str]:
    """parameters_problem of each of `schemas`. `in_worker`: the caller is the worker thread
    (offload.off_loop), which may wait for the worker process to check many unseen ones.
    `arguments` False: any JSON Schema (format_schema_problem)."""
    verdicts = [""] * len(schemas)
    unseen: list[tuple[int, _Key, bytes]] = []
    for n, parameters in enumerate(schemas):
        data = parameters.SerializeToString(deterministic=True)
        if len(data) > max_bytes:
            verdicts[n] = f"at most {max_bytes} bytes serialized (this one is {len(data)})"
            continue
        key = (digest(data), max_depth, arguments)
        with _lock:
            verdict = _cache.get(key)
            if verdict is not None:
                _cache.move_to_end(key)
                verdicts[n] = verdict
                continue
        unseen.append((n, key, data))
    if in_worker and sum(len(data) for _, _, data in unseen) >= IN_PROCESS_BYTES:
        found = in_process(check_serialized, [data for _, _, data in unseen], max_depth, arguments)
        for (n, key, _), (verdict, text) in zip(unseen, found, strict=True):
            if text:
                remember(key[0], text)
            verdicts[n] = _keep(key, verdict)
    else:
        for n, key, _ in unseen:
            verdicts[n] = _keep(key, _check(schemas[n], key[0], max_depth, arguments))
    return verdicts


def _keep(key: _Key, verdict: str) -> str:
    with _lock:
        _cache[key] = verdict
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return verdict


def check_serialized(schemas: list[bytes], max_depth: int, arguments: bool = True) -> list[tuple[str, str]]:
    """In the worker process: the verdict and the JSON text ("" when it has none) of each
    serialized schema."""
    return [_examine(struct_pb2.Struct.FromString(data), max_depth, arguments) for data in schemas]


def _check(parameters: struct_pb2.Struct, key: bytes, max_depth: int, arguments: bool) -> str:
    verdict, text = _examine(parameters, max_depth, arguments)
    if text:
        # The model calls that send this schema take its JSON text from there.
        remember(key, text)
    return verdict


def _examine(parameters: struct_pb2.Struct, max_depth: int, arguments: bool = True) -> tuple[str, str]:
    try:
        schema = struct_to_dict(parameters)
    except ValueError as err:
        if "NaN" in str(err) or "Infinity" in str(err):
            return "numbers must be finite (NaN and infinity are not JSON)", ""
        return f"not JSON: {err}", ""
    text = json.dumps(schema)
    if json_depth(text) > max_depth:
        return f"nested at most {max_depth} levels deep", text
    return schema_problem(schema, arguments), text


def schema_problem(schema: dict[str, object], arguments: bool = True) -> str:
    """Why `schema` is not a usable JSON Schema for function arguments ("" when it is);
    `arguments` False: for any value."""
    if arguments and schema.get("type", "object") != "object":
        return "the arguments schema must have type 'object'"
    if not isinstance(schema.get("$schema", ""), str):
        return "'$schema' must be a string (a meta-schema URI)"
    try:
        error = next(iter(_meta_for(schema.get("$schema")).iter_errors(schema)), None)
    except Exception as err:
        # The validator is third-party code fed untrusted input: whatever it trips over is the
        # schema's problem, not a failure of the gateway.
        log.debug("JSON Schema check failed", exc_info=True)
        return f"not a valid JSON Schema ({type(err).__name__})"
    if error is not None:
        path = "/".join(str(p) for p in error.instance_path)
        return f"not a valid JSON Schema: {error.message}" + (f" (at {path})" if path else "")
    if not arguments:
        # The answer is checked against it: a schema that cannot be compiled (a `$ref` to
        # something outside it) is refused now rather than failing the response at its end.
        try:
            compile_schema(schema)
        except ValueError as err:
            return f"not a usable JSON Schema: {shorten(str(err), 200)}"
    return ""
