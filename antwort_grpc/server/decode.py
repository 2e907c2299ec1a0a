"""Request bytes are parsed by our handlers, not by grpc, so bytes that do not parse (bad UTF-8 in
a string, a corrupt wire format, nesting past the parser's depth limit) are INVALID_ARGUMENT with
the field they are in. Left to grpc they are UNKNOWN with a Python exception text, and a logged
traceback.

Streamed requests (Converse) are parsed one message at a time as the servicer reads them.

A request that starts a response (CreateResponse; a Converse message that is a create) is handed to
the servicer undecoded (`RawRequest`): the core admits it by its size on the wire before it is
decoded, since decoding makes several times its bytes in objects, and a request refused after it
was decoded has cost them all.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from typing import Any

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from antwort_grpc.errors import FieldViolation, RequestError, invalid_argument
from antwort_grpc.grpc_status import abort
from antwort_grpc.offload import off_loop
from antwort_grpc.protowire import length_delimited, next_field, parse_in_pieces

# Requests larger than this are parsed in a worker thread, in pieces of 128 KiB
# (protowire.parse_in_pieces), so a 32 MiB request does not hold the event loop (and every other
# stream) while it is parsed, nor the GIL for longer than a piece.
PARSE_IN_THREAD_BYTES = 1 << 20
# How deep `locate` looks for the field that does not parse; past it, the path so far is named.
LOCATE_DEPTH = 8
# Structs are free-form: a problem inside one is reported at the Struct.
_OPAQUE = {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"}

Parse = Callable[[bytes], Message]

# Methods whose requests start a response, handed to the servicer undecoded (`RawRequest`): the
# core admits them by their size first. Every message of the method (EVERY_MESSAGE), or those
# with the top-level field of that number set (a Converse message that is a create).
EVERY_MESSAGE = 0


class RawRequest:
    """A request as it came off the wire (front.Encoded): its size, the refusal of one too
    large (naming the field that holds most of its bytes), and its decoding — off the event loop
    when it is large, INVALID_ARGUMENT naming the field that does not parse."""

    __slots__ = ("parse", "raw", "starts_response")

    def __init__(self, raw: bytes, parse: Parse, starts_response: bool = True) -> None:
        self.raw = raw
        self.parse = parse
        self.starts_response = starts_response

    @property
    def size(self) -> int:
        return len(self.raw)

    def too_large(self, limit: int) -> RequestError:
        return too_large(self.raw, limit, _message_descriptor(self.parse))

    async def decode(self) -> Any:
        raw, parse = self.raw, self.parse
        try:
            if len(raw) > PARSE_IN_THREAD_BYTES:
                message_class = getattr(parse, "__self__", None)
                if isinstance(message_class, type):
                    # In pieces: the event loop's thread gets the GIL between them.
                    return await off_loop(parse_in_pieces, message_class, raw)
                return await off_loop(parse, raw)
            return parse(raw)
        except DecodeError as err:
            raise unparsed(raw, parse, err) from None


def too_large(raw: bytes, limit: int, descriptor: Descriptor | None) -> RequestError:
    """INVALID_ARGUMENT for a request past the size limit, naming the field that holds most of
    its bytes (found by reading the framing, not by parsing it)."""
    where = (largest_field(raw, descriptor) if descriptor is not None else "") or "request"
    problem = f"the request is {len(raw)} bytes serialized, at most {limit} (ANTWORT_MAX_REQUEST_BYTES)"
    return invalid_argument([FieldViolation(where, problem)])


def largest_field(raw: bytes | memoryview, descriptor: Descriptor, depth: int = 0) -> str:
    """The path to the field of `raw` that holds the most bytes, three levels down at most (a
    Converse message's `create.input_items.items`), not into a repeated field; "" when the
    framing cannot be read."""
    sizes: dict[int, int] = {}
    payloads: dict[int, tuple[int, int]] = {}
    at = 0
    while at < len(raw):
        number, start, end = next_field(raw, at)  # type: ignore[arg-type]
        if number < 0 or end < 0 or end > len(raw):
            break
        sizes[number] = sizes.get(number, 0) + end - at
        if start >= 0:
            payloads[number] = (start, end)
        at = end
    if not sizes:
        return ""
    number = max(sizes, key=sizes.__getitem__)
    field = descriptor.fields_by_number.get(number)
    if field is None:
        return ""
    inner = field.message_type
    if depth < 2 and not field.is_repeated and inner is not None and inner.full_name not in _OPAQUE:
        start, end = payloads.get(number, (0, 0))
        below = largest_field(memoryview(raw)[start:end], inner, depth + 1)
        if below:
            return f"{field.name}.{below}"
    return field.name


class EventMessage:
    """A CreateResponseResponse or ConverseResponse holding `event` (field 1 of both), serialized
    without being built: building one copies the event, and a lifecycle event carries the whole
    Response (every tool schema of the request echoed), three times per response. `wire`: the
    event already serialized (the engine keeps a lifecycle event's bytes), written as it is."""

    __slots__ = ("event", "wire")

    def __init__(self, event: Message, wire: bytes | None = None) -> None:
        self.event = event
        self.wire = wire

    def SerializeToString(self) -> bytes:
        data = self.wire if self.wire is not None else self.event.SerializeToString()
        return length_delimited(1, data)


class EventBatch:
    """Events that leave together (a request's batch_events): the `events` field of a
    CreateResponseResponse (2) or a ConverseResponse (3), each event given serialized."""

    __slots__ = ("field", "wires")

    def __init__(self, wires: Sequence[bytes], field: int) -> None:
        self.wires = wires
        self.field = field

    def SerializeToString(self) -> bytes:
        field = self.field
        return b"".join([length_delimited(field, wire) for wire in self.wires])


def _serialize(message: Any) -> bytes:
    """A response as the wire carries it: a protobuf message, or an EventMessage."""
    data: bytes = message.SerializeToString()
    return data


class _Capture:
    """Stands in for a server to collect the method handlers a generated `add_…_to_server` makes."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.service = service
        self.handlers = dict(handlers)


# Told of each request that does not parse (the method's name, the error): the gateway counts them.
Refused = Callable[[str, RequestError], None]


def add_parsing_servicer(
    add: Callable[[Any, Any], None],
    servicer: object,
    server: grpc.aio.Server,
    refused: Refused | None = None,
    undecoded: Mapping[str, int] | None = None,
    registered: Collection[str] | None = None,
) -> None:
    """`add(servicer, server)` (a generated `add_…Servicer_to_server`), with every request parsed
    by `parse_request`, except those of the methods in `undecoded`, handed over as RawRequests.

    `registered`: the methods grpc matches calls to directly (None: all of them); the others are
    found through the generic handler. grpc.aio waits on a request for every registered method of
    the server in each turn of its intake (and grpc_accept.py keeps several asked ahead of each):
    every registered method costs every call, so only the busy ones are."""
    capture = _Capture()
    add(servicer, capture)
    handlers = {
        name: _parsing(handler, _teller(refused, name), (undecoded or {}).get(name))
        for name, handler in capture.handlers.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(capture.service, handlers),))
    if registered is not None:
        handlers = {name: handler for name, handler in handlers.items() if name in registered}
    if handlers:
        server.add_registered_method_handlers(capture.service, handlers)


def _message_descriptor(parse: Parse) -> Descriptor | None:
    message_class = getattr(parse, "__self__", None)
    descriptor = getattr(message_class, "DESCRIPTOR", None)
    return descriptor if isinstance(descriptor, Descriptor) else None


def _teller(refused: Refused | None, method: str) -> Callable[[RequestError], None] | None:
    if refused is None:
        return None

    def tell(error: RequestError) -> None:
        refused(method, error)

    return tell


def _parsing(handler: Any, refused: Callable[[RequestError], None] | None, undecoded: int | None) -> Any:
    parse = handler.request_deserializer
    if parse is None:
        return handler
    if handler.request_streaming:
        return _parsing_stream(handler, parse, undecoded)
    behavior = handler.unary_unary or handler.unary_stream
    if undecoded is not None:
        # The servicer decodes it (through the core, which admits it first). grpc makes the
        # RawRequest as its deserializer and calls the servicer itself: no coroutine of ours
        # around the call, which every await of a streamed response would pass through.
        def raw_request(raw: bytes) -> RawRequest:
            return RawRequest(raw, parse)

        make = grpc.unary_unary_rpc_method_handler if handler.unary_unary else grpc.unary_stream_rpc_method_handler
        return make(behavior, request_deserializer=raw_request, response_serializer=_serialize)
    if handler.unary_unary is not None:
        unary = handler.unary_unary

        async def unary_unary(raw: bytes, context: Any) -> Any:
            return await unary(await parse_request(raw, parse, context, refused), context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, response_serializer=handler.response_serializer)
    if handler.unary_stream is not None:
        # Our servicers write their streams (context.write): a coroutine, not a generator.
        stream = handler.unary_stream

        async def unary_stream(raw: bytes, context: Any) -> None:
            await stream(await parse_request(raw, parse, context, refused), context)

        return grpc.unary_stream_rpc_method_handler(unary_stream, response_serializer=_serialize)
    return handler


def _parsing_stream(handler: Any, parse: Parse, undecoded: int | None) -> Any:
    """A handler reading a stream of requests, given them as RawRequests: the servicer decodes
    them (through the core, which admits those that start a response first)."""
    behavior = handler.stream_stream or handler.stream_unary
    if behavior is None or inspect.isasyncgenfunction(behavior) or undecoded is None:
        # No servicer of ours answers a stream with a generator: left as grpc runs it.
        return handler

    async def run(requests: AsyncIterator[bytes], context: Any) -> Any:
        async def raw_requests() -> AsyncIterator[RawRequest]:
            async for raw in requests:
                starts = undecoded == EVERY_MESSAGE or has_field(raw, undecoded)
                yield RawRequest(raw, parse, starts)

        return await behavior(raw_requests(), context)

    make = grpc.stream_stream_rpc_method_handler if handler.stream_stream else grpc.stream_unary_rpc_method_handler
    return make(run, response_serializer=_serialize)


async def parse_request(
    raw: bytes, parse: Parse, context: Any, refused: Callable[[RequestError], None] | None = None
) -> Any:
    """The request `raw` holds; aborts the call with INVALID_ARGUMENT (`refused` is told) when it
    does not parse."""
    try:
        return await RawRequest(raw, parse).decode()
    except RequestError as error:
        if refused is not None:
            refused(error)
        await abort(context, error)
        raise AssertionError("unreachable") from None


def unparsed(raw: bytes, parse: Parse, err: DecodeError) -> RequestError:
    """INVALID_ARGUMENT for bytes that do not parse, naming the field they break in."""
    descriptor = _message_descriptor(parse)
    field = locate(raw, descriptor) if descriptor is not None else ""
    # The parser's reason is a fixed text ("String field had bad UTF-8", "Wire format was
    # corrupt", "Exceeded …MaxDepth"); what follows the type name in its message.
    reason = str(err).rsplit(": ", 1)[-1]
    return invalid_argument([FieldViolation(field or "request", f"cannot be parsed: {reason}")])


def locate(raw: bytes, descriptor: Descriptor, depth: int = 0) -> str:
    """The path of the first field of `raw` (a message of type `descriptor`) whose bytes do not
    parse, as far down as LOCATE_DEPTH; "" when the framing of `raw` itself is broken."""
    message_class = GetMessageClass(descriptor)
    counts: dict[int, int] = {}
    for number, start, end, payload in _fields(raw):
        index = counts.get(number, 0)
        counts[number] = index + 1
        try:
            message_class.FromString(raw[start:end])
            continue
        except DecodeError:
            pass
        field = descriptor.fields_by_number.get(number)
        if field is None:
            return ""
        name = field.name
        if field.is_repeated and not _is_map(field):
            name += f"[{index}]"
        inner = field.message_type
        if (
            payload is not None
            and inner is not None
            and not _is_map(field)
            and inner.full_name not in _OPAQUE
            and depth < LOCATE_DEPTH
        ):
            below = locate(payload, inner, depth + 1)
            if below:
                return f"{name}.{below}"
        return name
    return ""


def _fields(raw: bytes) -> list[tuple[int, int, int, bytes | None]]:
    """(field number, start, end, length-delimited payload or None) for each field on the wire;
    the fields read before the framing broke."""
    found: list[tuple[int, int, int, bytes | None]] = []
    at = 0
    while at < len(raw):
        start = at
        number, payload_at, at = next_field(raw, at)
        if at < 0 or at > len(raw) or number <= 0:
            break
        found.append((number, start, at, raw[payload_at:at] if payload_at >= 0 else None))
    return found


def has_field(raw: bytes, number: int) -> bool:
    """Whether the top level of the message `raw` holds field `number`: read from the tags and
    lengths alone, nothing copied (False when the framing breaks first: the parser will say why)."""
    at = 0
    while 0 <= at < len(raw):
        found, _, at = next_field(raw, at)
        if found == number:
            return True
        if found < 0:
            return False
    return False


def _is_map(field: FieldDescriptor) -> bool:
    inner = field.message_type
    return inner is not None and inner.GetOptions().map_entry
