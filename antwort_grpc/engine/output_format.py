"""Is a completed response's answer what its text format asked for (Structured Outputs)?

The backend is asked for the format (`response_format`), but not every backend enforces it, and
one that does may still be cut short or ignore a non-strict schema: the answer is checked once the
response would complete. An answer that is not JSON, not an object (json_object) or not valid
against the schema (json_schema) ends the response FAILED with code `output_format_mismatch`
and the first problem in its message; the answer stays in the output. An answer that is a refusal,
or a response that ends with calls, is not checked.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import jsonschema_rs
from google.protobuf import struct_pb2

from antwort_grpc import pb
from antwort_grpc.engine.outcomes import Completed, Failed, FinalOutcome
from antwort_grpc.errors import shorten
from antwort_grpc.structs import DigestCache, digest, integral, struct_to_dict

MISMATCH = "output_format_mismatch"
# Compiled schemas kept (clients send the same few with every request).
CACHE_SIZE = 256
_validators: DigestCache[Any] = DigestCache(CACHE_SIZE, lambda _: 1)


def compile_schema(schema: dict[str, Any]) -> Any:
    """A validator of `schema`. Offline: a `$ref` to anything outside the schema is an error
    (ValueError), never a request the gateway makes."""
    try:
        return jsonschema_rs.validator_for(schema, offline=True)
    except Exception as err:  # third-party code fed a client's schema: its problem, not ours
        raise ValueError((str(err).splitlines() or [type(err).__name__])[0]) from None


def _validator(schema: struct_pb2.Struct) -> Any:
    key = digest(schema.SerializeToString(deterministic=True))
    validator = _validators.get(key)
    if validator is None:
        validator = compile_schema(integral(struct_to_dict(schema)))
        _validators.put(key, validator)
    return validator


def answer_text(output: Sequence[pb.Item]) -> str | None:
    """The text of the final answer: the last output item, when it is a message with no refusal.
    None when the response ends otherwise."""
    if not output or output[-1].WhichOneof("kind") != "message":
        return None
    parts = output[-1].message.content
    if any(part.WhichOneof("part") == "refusal" for part in parts):
        return None
    return "".join(part.output_text.text for part in parts)


def format_problem(form: pb.TextFormat, text: str) -> str:
    """Why `text` is not what `form` asks for ("" when it is)."""
    try:
        value = json.loads(text)
    except ValueError as err:
        return f"the answer is not JSON ({err})"
    if form.WhichOneof("kind") == "json_object":
        return "" if isinstance(value, dict) else "the answer is JSON but not an object"
    try:
        error = next(iter(_validator(form.json_schema.schema).iter_errors(value)), None)
    except ValueError as err:
        return f"the schema cannot be used: {err}"
    if error is None:
        return ""
    path = "/".join(str(p) for p in error.instance_path)
    return f"{error.message}" + (f" (at /{path})" if path else "")


def checked(form: pb.TextFormat | None, output: Sequence[pb.Item], outcome: FinalOutcome) -> FinalOutcome:
    """`outcome`, or Failed when it completes with an answer that does not have the form asked for."""
    if form is None or not isinstance(outcome, Completed):
        return outcome
    text = answer_text(output)
    if text is None:
        return outcome
    problem = format_problem(form, text)
    if not problem:
        return outcome
    kind = form.WhichOneof("kind")
    name = f" {form.json_schema.name!r}" if kind == "json_schema" else ""
    return Failed(MISMATCH, f"the model's answer does not match text.format ({kind}{name}): {shorten(problem, 300)}")
