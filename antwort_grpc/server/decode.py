"""Request bytes are parsed by our handlers, not by grpc, so bytes that do not parse (bad UTF-8 in
a string, a corrupt wire format, nesting past the parser's depth limit) are INVALID_ARGUMENT with
the field they are in. Left to grpc they are UNKNOWN with a Python exception text, and a logged
traceback.

Streamed requests (Converse) are parsed one message at a time as the servicer reads them.

A request that starts a response (CreateResponse; a Converse message that is a create) is admitted
by its size on the wire before it is parsed (`Admitting`): parsing makes several times its bytes
in objects, and a request refused after it was parsed has cost them all.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from antwort_grpc.edge import Reservation
from antwort_grpc.errors import FieldViolation, RequestError, invalid_argument
from antwort_grpc.grpc_status import abort
from antwort_grpc.offload import off_loop
from antwort_grpc.protowire import length_delimited, next_field

# Requests larger than this are parsed in a worker thread, so a 32 MiB request does not hold the
# event loop (and every other stream) while it is parsed.
PARSE_IN_THREAD_BYTES = 1 << 20
# How deep `locate` looks for the field that does not parse; past it, the path so far is named.
LOCATE_DEPTH = 8
# Structs are free-form: a problem inside one is reported at the Struct.
_OPAQUE = {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"}

Parse = Callable[[bytes], Message]

# The size on the wire of the request last parsed in this task (the unary call's; on a stream,
# the message its reader took last): what admission weighs, known without walking the message
# (ByteSize walks it: 20 ms for a request of 8 MB). 0: not parsed here.
request_bytes: ContextVar[int] = ContextVar("request_bytes", default=0)
# The admission reserved for the request last parsed in this task, before it was parsed (None:
# none was, the request starts no response): the response takes it over (Edge.response).
reservation: ContextVar[Reservation | None] = ContextVar("reservation", default=None)

# Every message of the method starts a response (rather than those with this field set).
EVERY_MESSAGE = 0


@dataclass(frozen=True)
class Admitting:
    """Which requests are admitted before they are parsed: `reserve` (Admission.reserve) is
    given the size of each message of a method in `methods` that starts a response: every
    message (EVERY_MESSAGE), or those with the top-level field of that number set (a Converse
    message that is a create). One larger than `max_request_bytes` (0: no limit) is refused
    first, INVALID_ARGUMENT naming its largest field."""

    reserve: Callable[[int], Reservation]
    methods: Mapping[str, int]
    max_request_bytes: int = 0

    def starts_response(self, method: str, raw: bytes) -> bool:
        field = self.methods.get(method)
        if field is None:
            return False
        return field == EVERY_MESSAGE or has_field(raw, field)


class _Admit:
    """The admission of one method's messages before they are parsed: the reservation for one
    that starts a response (None for one that does not)."""

    __slots__ = ("admitting", "descriptor", "method")

    def __init__(self, admitting: Admitting, method: str, descriptor: Descriptor | None = None) -> None:
        self.admitting = admitting
        self.method = method
        self.descriptor = descriptor

    def __call__(self, raw: bytes) -> Reservation | None:
        admitting = self.admitting
        if not admitting.starts_response(self.method, raw):
            return None
        if admitting.max_request_bytes and len(raw) > admitting.max_request_bytes:
            raise too_large(raw, admitting.max_request_bytes, self.descriptor)
        return admitting.reserve(len(raw))


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

    def __init__(self, wires: list[bytes], field: int) -> None:
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
    admitting: Admitting | None = None,
) -> None:
    """`add(servicer, server)` (a generated `add_…Servicer_to_server`), with every request parsed
    by `parse_request`, those that start a response admitted first (`admitting`)."""
    capture = _Capture()
    add(servicer, capture)
    handlers = {
        name: _parsing(
            handler, _teller(refused, name), _Admit(admitting, name, _descriptor(handler)) if admitting else None
        )
        for name, handler in capture.handlers.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(capture.service, handlers),))
    server.add_registered_method_handlers(capture.service, handlers)


def _descriptor(handler: Any) -> Descriptor | None:
    message_class = getattr(handler.request_deserializer, "__self__", None)
    descriptor = getattr(message_class, "DESCRIPTOR", None)
    return descriptor if isinstance(descriptor, Descriptor) else None


def _teller(refused: Refused | None, method: str) -> Callable[[RequestError], None] | None:
    if refused is None:
        return None

    def tell(error: RequestError) -> None:
        refused(method, error)

    return tell


def _parsing(handler: Any, refused: Callable[[RequestError], None] | None = None, admit: _Admit | None = None) -> Any:
    parse = handler.request_deserializer
    if parse is None:
        return handler
    if handler.request_streaming:
        return _parsing_stream(handler, parse, refused, admit)
    if handler.unary_unary is not None:
        unary = handler.unary_unary

        async def unary_unary(raw: bytes, context: Any) -> Any:
            try:
                return await unary(await parse_request(raw, parse, context, refused, admit), context)
            finally:
                _release()

        return grpc.unary_unary_rpc_method_handler(unary_unary, response_serializer=handler.response_serializer)
    if handler.unary_stream is not None:
        stream: Callable[[Any, Any], AsyncGenerator[Any]] = handler.unary_stream

        # A coroutine that writes, rather than an async generator around the servicer's: grpc's
        # own loop over a generator writes each message the same way, so nothing is added per
        # streamed message. try/finally is contextlib.aclosing without its two Python-level calls
        # per request.
        async def unary_stream(raw: bytes, context: Any) -> None:
            try:
                request = await parse_request(raw, parse, context, refused, admit)
                messages = stream(request, context)
                try:
                    async for message in messages:
                        await context.write(message)
                finally:
                    await messages.aclose()
            finally:
                # The response that took the reservation over has released it; else (refused by
                # a later check, or never started) it is released here.
                _release()

        return grpc.unary_stream_rpc_method_handler(unary_stream, response_serializer=_serialize)
    return handler


def _release() -> None:
    held = reservation.get()
    if held is not None:
        held.release()


def _parsing_stream(
    handler: Any, parse: Parse, refused: Callable[[RequestError], None] | None, admit: _Admit | None
) -> Any:
    """A handler reading a stream of requests, given them parsed. A message that does not parse
    ends the call with INVALID_ARGUMENT (the servicer's read raises grpc's abort error). A message
    refused admission is not parsed: the servicer reads the RequestError in its place (and counts
    it: it decides whether the refusal ends the stream), `reservation` is set for one admitted."""
    behavior = handler.stream_stream or handler.stream_unary
    if behavior is None or inspect.isasyncgenfunction(behavior):
        # No servicer of ours answers a stream with a generator: left as grpc runs it.
        return handler

    async def run(requests: AsyncIterator[bytes], context: Any) -> Any:
        aborted: list[BaseException] = []

        async def parsed() -> AsyncIterator[Any]:
            async for raw in requests:
                try:
                    yield await parse_request(raw, parse, context, refused, admit, in_band=True)
                except grpc.aio.AbortError as err:
                    aborted.append(err)
                    raise

        result = await behavior(parsed(), context)
        if aborted:
            # The servicer stopped reading on the abort without passing it on: pass it to grpc,
            # which expects the abort it was told about (or logs it as suppressed).
            raise aborted[0]
        return result

    make = grpc.stream_stream_rpc_method_handler if handler.stream_stream else grpc.stream_unary_rpc_method_handler
    return make(run, response_serializer=_serialize)


async def parse_request(
    raw: bytes,
    parse: Parse,
    context: Any,
    refused: Callable[[RequestError], None] | None = None,
    admit: _Admit | None = None,
    in_band: bool = False,
) -> Any:
    """The request `raw` holds; aborts the call with INVALID_ARGUMENT (`refused` is told) when it
    does not parse. Its size is `request_bytes` in the task that asked, until the next one.

    One that starts a response is admitted first (`admit`), its reservation `reservation` in the
    task that asked; refused, it is not parsed: the call is aborted with the refusal (`refused`
    told), or, `in_band`, the refusal is returned in place of the request."""
    request_bytes.set(len(raw))
    reservation.set(None)
    if admit is not None:
        try:
            reservation.set(admit(raw))
        except RequestError as err:
            if in_band:
                return err
            if refused is not None:
                refused(err)
            await abort(context, err)
            raise AssertionError("unreachable") from None
    try:
        if len(raw) > PARSE_IN_THREAD_BYTES:
            return await off_loop(parse, raw)
        return parse(raw)
    except BaseException as err:
        # Not parsed (or the call cancelled while it was): no response will take the room over.
        _release()
        if not isinstance(err, DecodeError):
            raise
        return await _unparsed(raw, parse, context, refused, err)


async def _unparsed(
    raw: bytes, parse: Parse, context: Any, refused: Callable[[RequestError], None] | None, err: DecodeError
) -> Any:
    message_class = getattr(parse, "__self__", None)
    descriptor = getattr(message_class, "DESCRIPTOR", None)
    field = locate(raw, descriptor) if isinstance(descriptor, Descriptor) else ""
    # The parser's reason is a fixed text ("String field had bad UTF-8", "Wire format was
    # corrupt", "Exceeded …MaxDepth"); what follows the type name in its message.
    reason = str(err).rsplit(": ", 1)[-1]
    where = field or "request"
    error = invalid_argument([FieldViolation(where, f"cannot be parsed: {reason}")])
    if refused is not None:
        refused(error)
    await abort(context, error)
    raise AssertionError("unreachable") from None


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
