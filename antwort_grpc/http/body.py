"""A request body of the HTTP door, from its bytes to the request it asks for, bounded at each
step, so that a body costs no more than the request it makes may cost, and never the event loop's
time (docs/limits.md, "The HTTP door's bodies"):

- its bytes, before it is read (`Content-Length`) and as it is read: at most
  `ANTWORT_MAX_REQUEST_BYTES` (and `ANTWORT_HTTP_MAX_BODY_BYTES`), else 413;
- its JSON: UTF-8, no `NaN` or `Infinity`, nested at most MAX_DEPTH levels, no lone surrogate (a
  `\\ud800` escape without its pair is no Unicode character: protobuf, the stores and the model
  backends cannot carry it) — else 400 naming where;
- its counts before it is mapped (input items, tools: ANTWORT_MAX_INPUT_ITEMS, ANTWORT_MAX_TOOLS),
  how deep a tool's schema nests (ANTWORT_MAX_SCHEMA_DEPTH: protobuf refuses to decode what it
  may build deeper), and the tools' bytes once mapped (ANTWORT_MAX_TOOLS_BYTES).

A body larger than INLINE_BYTES is parsed, checked and mapped in the worker process
(offload.off_process): `json.loads` is one call into C holding the GIL for the whole body (a
thread would stop the event loop as long), and the mapping is pure Python. What comes back is
the request serialized, parsed as the gRPC door parses a large request: in the worker thread.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from aiohttp import web
from google.protobuf.message import Message

from antwort_grpc import pb
from antwort_grpc.errors import FieldViolation, RequestError, invalid_argument
from antwort_grpc.http.compaction import compaction_request
from antwort_grpc.http.jsonread import fail
from antwort_grpc.http.mapping import create_request
from antwort_grpc.offload import off_loop, off_process
from antwort_grpc.protowire import parse_in_pieces

log = logging.getLogger(__name__)
T = TypeVar("T")


class Limits(Protocol):
    """What a body may hold: the core's request limits (responses/request_limits.py; the door
    reaches them through the front, and hands them to the worker process, pickled)."""

    @property
    def max_tools(self) -> int: ...
    @property
    def max_schema_depth(self) -> int: ...
    @property
    def max_tools_bytes(self) -> int: ...
    @property
    def max_input_items(self) -> int: ...
    @property
    def max_content_parts(self) -> int: ...


M = TypeVar("M", bound=Message)

# Up to this many bytes a body is parsed and mapped on the event loop (a few ms at most: 250
# one-word messages, or a schema of 300 properties); larger ones in the worker process, which costs
# a round trip of about a millisecond.
INLINE_BYTES = 8 * 1024
# A mapped request larger than this is parsed in the worker thread (as the gRPC door does).
PARSE_IN_THREAD_BYTES = 1 << 20
# How deep a body may nest (objects and arrays; `{}` is 1). A request needs 24 at most (a tool's
# schema at its own limit); a deeper one would only reach the parser's recursion limit.
MAX_DEPTH = 64
# The deepest schema protobuf decodes again inside a stream event (about 32 levels of objects;
# room kept for the messages a Response is carried in): a tighter ANTWORT_MAX_SCHEMA_DEPTH wins.
MAX_CARRIED_SCHEMA_DEPTH = 24

# A \uD800-\uDBFF escape not followed by a \uDC00-\uDFFF one, or the latter not preceded by the
# former: what may decode to a lone surrogate (a false alarm, an escaped backslash before "u",
# costs one walk over the body).
_LONE_ESCAPE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F]"
)


class BodyTooLarge(Exception):
    """A body larger than the door takes: 413, said before the rest of it is read."""

    def __init__(self, size: int, limit: int, setting: str, read: bool) -> None:
        self.limit = limit
        self.setting = setting
        what = f"at least {size}" if read else str(size)
        super().__init__(f"the request body is {what} bytes, at most {limit} ({setting})")


@dataclass(frozen=True)
class BodyLimit:
    """The most bytes a body may have, and the setting that says so."""

    limit: int
    setting: str


def body_limit(max_body_bytes: int, max_request_bytes: int) -> BodyLimit:
    """The tighter of the door's body limit and the request limit (0: none) both doors apply."""
    if max_request_bytes and max_request_bytes < max_body_bytes:
        return BodyLimit(max_request_bytes, "ANTWORT_MAX_REQUEST_BYTES")
    return BodyLimit(max_body_bytes, "ANTWORT_HTTP_MAX_BODY_BYTES")


async def read_body(request: web.Request, bound: BodyLimit) -> bytes:
    """The body, refused at its declared length or as soon as what came passes the limit (a
    chunked body has none declared): a refused body is not held whole."""
    declared = request.content_length
    if declared is not None and declared > bound.limit:
        raise BodyTooLarge(declared, bound.limit, bound.setting, read=False)
    content = request.content
    chunks: list[bytes] = []
    size = 0
    # readany() until the end, not `iter_any()`: no async iterator made per body.
    while chunk := await content.readany():
        size += len(chunk)
        if size > bound.limit:
            raise BodyTooLarge(size, bound.limit, bound.setting, read=True)
        chunks.append(chunk)
    return b"".join(chunks)


# ------------------------------------------------------------------------------ the JSON


def parse_json(raw: bytes) -> object:
    """The JSON value of `raw`; RequestError (INVALID_ARGUMENT naming where) for bytes that are
    not UTF-8, text that is not JSON (`NaN` and `Infinity` are not), nesting past MAX_DEPTH, or
    a lone surrogate in a string or a key."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        fail("body", f"not valid UTF-8 (byte {err.start})")
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        fail("body", f"nested more than {MAX_DEPTH} levels deep")
    except ValueError as err:
        fail("body", f"not valid JSON: {err}")
    # The walk only when it may find something: a lone surrogate needs a \u escape, nesting past
    # MAX_DEPTH that many brackets (those in strings counted too: at worst a walk for nothing).
    # A plain small body costs two scans in C instead of a regex search and a walk.
    strings = b"\\u" in raw and _LONE_ESCAPE.search(raw) is not None
    if strings or raw.count(b"{") + raw.count(b"[") > MAX_DEPTH:
        problem = _walk(value, MAX_DEPTH, strings=strings)
        if problem is not None:
            where, what = problem
            fail(where, what)
    return value


def _constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


# One decoder for every body (json.loads with an option builds a decoder per call).
_DECODER = json.JSONDecoder(parse_constant=_constant)


def _walk(value: object, max_depth: int, strings: bool) -> tuple[str, str] | None:
    """(where, what) of the first container nested past `max_depth`, or (`strings`) of the first
    string or key holding a lone surrogate; None when there is none. Iterative: a body nested as
    deep as the parser allows must not exhaust the stack here."""
    if not isinstance(value, dict | list):
        return (
            ("body", "holds a lone surrogate: not valid Unicode") if isinstance(value, str) and _lone(value) else None
        )
    stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(value, 1, ())]
    while stack:
        node, depth, path = stack.pop()
        if depth > max_depth:
            # Named by the parameter it is in (its first steps: `tools[2].parameters`).
            return _path(path[:3]), f"nested more than {max_depth} levels deep (the body's nesting)"
        entries = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in entries:
            if strings and isinstance(key, str) and _lone(key):
                return _path(path), f"the key {_printable(key)!r} holds a lone surrogate: not valid Unicode"
            if isinstance(child, dict | list):
                stack.append((child, depth + 1, (*path, key)))
            elif strings and isinstance(child, str) and _lone(child):
                return _path(
                    (*path, key)
                ), "holds a lone surrogate (an unpaired \\ud800-\\udfff escape): not valid Unicode"
    return None


def _lone(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _printable(text: str) -> str:
    return text[:64].encode("utf-8", "backslashreplace").decode("utf-8")


def _path(path: tuple[str | int, ...]) -> str:
    """A JSON path as the error's `param` names one: `input[2].content`."""
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else (f".{_printable(step)}" if out else _printable(step))
    return out or "body"


def _deeper_than(value: object, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


# --------------------------------------------------------------------- bounds, mapping


def bounded(body: object, limits: Limits) -> object:
    """`body`, checked for what its mapping would cost before it is mapped: its counts of input
    items, their content parts and tools, and how deep each schema nests."""
    if not isinstance(body, dict):
        return body
    items = body.get("input")
    if isinstance(items, list):
        _count_items(items, limits)
    tools = body.get("tools")
    if isinstance(tools, list):
        _count_tools(tools, limits)
    text = body.get("text")
    if isinstance(text, dict):
        form = text.get("format")
        schema = form.get("schema") if isinstance(form, dict) else None
        depth = _schema_depth(limits)
        if isinstance(schema, dict | list) and _deeper_than(schema, depth):
            fail("text.format.schema", f"nested more than {depth} levels deep (ANTWORT_MAX_SCHEMA_DEPTH)")
    return body


def _schema_depth(limits: Limits) -> int:
    return min(limits.max_schema_depth, MAX_CARRIED_SCHEMA_DEPTH)


def _count_tools(tools: list[Any], limits: Limits) -> None:
    if len(tools) > limits.max_tools:
        fail("tools", f"at most {limits.max_tools} tools (this request has {len(tools)}; ANTWORT_MAX_TOOLS)")
    depth = _schema_depth(limits)
    for n, tool in enumerate(tools):
        schema = tool.get("parameters") if isinstance(tool, dict) else None
        if isinstance(schema, dict) and _deeper_than(schema, depth):
            fail(f"tools[{n}].parameters", f"nested more than {depth} levels deep (ANTWORT_MAX_SCHEMA_DEPTH)")


def _count_items(items: list[Any], limits: Limits) -> None:
    if len(items) > limits.max_input_items:
        count = len(items)
        fail("input", f"at most {limits.max_input_items} items (this request has {count}; ANTWORT_MAX_INPUT_ITEMS)")
    contents = (item.get("content") if isinstance(item, dict) else None for item in items)
    parts = sum(len(content) for content in contents if isinstance(content, list))
    if parts > limits.max_content_parts:
        # The same words as the core's check (responses/validation.py).
        most = limits.max_content_parts
        fail("input", f"at most {most} content parts in all (this has {parts}; ANTWORT_MAX_CONTENT_PARTS)")


def _tools_within(request: pb.CreateResponseRequest, limits: Limits) -> None:
    """The tools' bytes, checked where they were mapped: a request the validation would refuse
    for them is not sent back to be parsed (the same violation)."""
    if (size := sum(tool.ByteSize() for tool in request.tools)) > limits.max_tools_bytes:
        fail("tools", f"at most {limits.max_tools_bytes} bytes serialized together (these are {size})")


def create_from(raw: bytes, limits: Limits) -> pb.CreateResponseRequest:
    """A create request from a body's bytes, every check above made (inline or in the worker)."""
    request = create_request(bounded(parse_json(raw), limits))
    if request.tools:
        _tools_within(request, limits)
    return request


def compaction_from(raw: bytes, limits: Limits) -> pb.CompactConversationRequest:
    return compaction_request(bounded(parse_json(raw), limits))


@dataclass(frozen=True)
class Mapped:
    """What the worker process sends back: the request serialized, or the violations that refused
    it (a RequestError itself does not pickle)."""

    wire: bytes = b""
    violations: tuple[tuple[str, str], ...] = ()


def _refusal(err: RequestError) -> Mapped:
    found = tuple((v.field, v.description) for v in err.violations) or (("body", err.message),)
    return Mapped(violations=found)


def create_in_worker(raw: bytes, limits: Limits) -> Mapped:
    """In the worker process: create_from, serialized."""
    try:
        return Mapped(create_from(raw, limits).SerializeToString())
    except RequestError as err:
        return _refusal(err)


def compaction_in_worker(raw: bytes, limits: Limits) -> Mapped:
    try:
        return Mapped(compaction_from(raw, limits).SerializeToString())
    except RequestError as err:
        return _refusal(err)


def json_in_worker(raw: bytes, limits: Limits) -> object:
    """In the worker process: a control's body parsed, its input items counted (what comes back
    is pickled: bounded by the items a request may hold)."""
    try:
        return bounded(parse_json(raw), limits)
    except RequestError as err:
        return _refusal(err)


# ------------------------------------------------------------------------ on the loop


async def read_create(raw: bytes, limits: Limits) -> pb.CreateResponseRequest:
    """The create request a body asks for; RequestError (INVALID_ARGUMENT naming the parameter)."""
    if len(raw) <= INLINE_BYTES:
        return _logged(create_from, raw, limits)
    mapped = _unpacked(await off_process(create_in_worker, raw, limits))
    return await _parsed(pb.CreateResponseRequest, mapped.wire)


async def read_compaction(raw: bytes, limits: Limits) -> pb.CompactConversationRequest:
    """The compaction a compact body asks for (compaction.compaction_request)."""
    if len(raw) <= INLINE_BYTES:
        return _logged(compaction_from, raw, limits)
    mapped = _unpacked(await off_process(compaction_in_worker, raw, limits))
    return await _parsed(pb.CompactConversationRequest, mapped.wire)


async def read_json(raw: bytes, limits: Limits) -> object:
    """A body's JSON value (a control's), checked as parse_json and `bounded` check it."""
    if len(raw) <= INLINE_BYTES:
        return _logged(lambda data, lim: bounded(parse_json(data), lim), raw, limits)
    value = await off_process(json_in_worker, raw, limits)
    if isinstance(value, Mapped):
        _unpacked(value)
    return value


def _logged(read: Callable[[bytes, Limits], T], raw: bytes, limits: Limits) -> T:
    try:
        return read(raw, limits)
    except RequestError as err:
        _log_refused(err)
        raise


def _unpacked(mapped: Mapped) -> Mapped:
    if mapped.violations:
        err = invalid_argument([FieldViolation(field, what) for field, what in mapped.violations])
        _log_refused(err)
        raise err
    return mapped


async def _parsed(message: type[M], wire: bytes) -> M:
    if len(wire) > PARSE_IN_THREAD_BYTES:
        return await off_loop(parse_in_pieces, message, wire)
    return message.FromString(wire)


def _log_refused(err: RequestError) -> None:
    # One line a refused body, never its content (it may be anything): the parameter and why.
    log.info("a request body was refused: %s", err.message[:300])
