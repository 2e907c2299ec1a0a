"""The one owner of a response's stream state: sequence numbers, output indexes, open items and
the Response being built. Everything that becomes an event goes through here.

Provider deltas arrive with `on_*` methods. Items stay open while deltas may still come: a
message until the turn moves on to reasoning or tool calls, tool calls (keyed by the provider's
index) until the turn ends. `close_turn` closes what is open, in output order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from antwort_grpc import pb
from antwort_grpc.ids import new_id
from antwort_grpc.protowire import length_delimited, varint

Status = pb.ItemStatus
# Plain ints: a protobuf enum attribute lookup is a Python-level call, and these are read per item.
COMPLETED = Status.ITEM_STATUS_COMPLETED
IN_PROGRESS = Status.ITEM_STATUS_IN_PROGRESS
INCOMPLETE = Status.ITEM_STATUS_INCOMPLETE
ASSISTANT = pb.Role.ROLE_ASSISTANT
_S = pb.ResponseStatus
RESPONSE_COMPLETED: int = _S.RESPONSE_STATUS_COMPLETED
RESPONSE_REQUIRES_ACTION: int = _S.RESPONSE_STATUS_REQUIRES_ACTION
RESPONSE_INCOMPLETE: int = _S.RESPONSE_STATUS_INCOMPLETE
RESPONSE_CANCELLED: int = _S.RESPONSE_STATUS_CANCELLED

# The lifecycle events of StreamEvent (each holds its Response at field 1), and the terminal one
# of each final status.
_EVENT_FIELDS = pb.StreamEvent.DESCRIPTOR.fields_by_name
_RESPONSE_FIELDS = pb.Response.DESCRIPTOR.fields
_TOOLS: int = pb.Response.DESCRIPTOR.fields_by_name["tools"].number
_METADATA: int = pb.Response.DESCRIPTOR.fields_by_name["metadata"].number
_MESSAGES = {f.number for f in _RESPONSE_FIELDS if f.message_type is not None and not f.is_repeated}
_REPEATED_MESSAGES = {f.number for f in _RESPONSE_FIELDS if f.message_type is not None and f.is_repeated} - {
    _TOOLS,
    _METADATA,
}
# Echoed tools past this many bytes make each lifecycle event a half-millisecond parse or more.
HEAVY_TOOLS_BYTES = 64 << 10

_TERMINAL = {
    RESPONSE_COMPLETED: "completed",
    RESPONSE_REQUIRES_ACTION: "requires_action",
    RESPONSE_INCOMPLETE: "incomplete",
    RESPONSE_CANCELLED: "cancelled",
}


@dataclass(slots=True)
class _OpenMessage:
    item: pb.Item
    index: int
    # Kept as a str by every open item: reading it back from the protobuf costs more, per delta.
    item_id: str
    # (content index, kind, accumulated fragments) of the part receiving deltas.
    part_index: int = -1
    part_kind: str = ""
    fragments: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _OpenItem:
    """A reasoning item or a function call receiving deltas (of its text, of its arguments)."""

    item: pb.Item
    index: int
    item_id: str
    fragments: list[str] = field(default_factory=list)


class ResponseEmitter:
    def __init__(self, response: pb.Response, ending: pb.StreamEvent | None = None, tools: bytes | None = None) -> None:
        """`ending`: the event `response` was built in, as its `completed`: the terminal event
        when the response completes, without a copy. `tools`: its echoed tools serialized, as
        `echoed_tools` gives them, when they were."""
        self.response = response
        self._seq = 0
        self._message: _OpenMessage | None = None
        self._reasoning: _OpenItem | None = None
        self._calls: dict[int, _OpenItem] = {}
        # Items finished in the current turn, in output order: what the loop looks at.
        self.turn_items: list[pb.Item] = []
        # The lifecycle events made last (at most two) and their serialized form, until their
        # writer takes them.
        self._wire: list[tuple[pb.StreamEvent, bytes]] = []
        self._ending = ending
        # The Response's echoed tools serialized (field and all), once they were.
        self._tools = tools

    @property
    def sequence_number(self) -> int:
        return self._seq

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    # -- lifecycle -----------------------------------------------------------------------------

    # A lifecycle event carries the whole Response, every tool schema of the request echoed:
    # copied into each event, that is serialized and parsed once per event, and serialized once
    # more when the event is written. For a Response echoing tools, the Response is serialized
    # once per lifecycle point (`created` and `in_progress` share it) and its tools (which never
    # change while it runs) once per response; the event is parsed from those bytes, and the bytes
    # are kept for the writer (`take_wire`). A Response without tools is small: copied into the
    # event, which costs less than the bytes' way.

    def opening(self) -> tuple[pb.StreamEvent, pb.StreamEvent]:
        """`created` and `in_progress`, from one serialization of the Response."""
        if not self._echoes_tools():
            return self._copied("created"), self._copied("in_progress")
        response = length_delimited(1, self._serialized())
        created = self._lifecycle("created", response)
        kept = self._wire
        in_progress = self._lifecycle("in_progress", response)
        self._wire = kept + self._wire
        return created, in_progress

    def created(self) -> pb.StreamEvent:
        if not self._echoes_tools():
            return self._copied("created")
        return self._lifecycle("created", length_delimited(1, self._serialized()))

    def in_progress(self) -> pb.StreamEvent:
        if not self._echoes_tools():
            return self._copied("in_progress")
        return self._lifecycle("in_progress", length_delimited(1, self._serialized()))

    def terminal(
        self, tool_calls: list[pb.FunctionCall] | None = None, approvals: list[pb.ApprovalRequest] | None = None
    ) -> pb.StreamEvent:
        """The one terminal event, chosen by the response's (final) status."""
        kind = _TERMINAL.get(self.response.status, "failed")
        ending, self._ending = self._ending, None
        if ending is not None and kind == "completed":
            return self._ended(ending)
        if not self._echoes_tools():
            event = self._copied(kind)
            if kind == "requires_action":
                event.requires_action.tool_calls.extend(tool_calls or [])
                event.requires_action.approval_requests.extend(approvals or [])
            return event
        payload = length_delimited(1, self._serialized())
        if kind == "requires_action" and (tool_calls or approvals):
            # Fields after the response: the rest of a ResponseRequiresActionEvent.
            payload += pb.ResponseRequiresActionEvent(
                tool_calls=tool_calls or [], approval_requests=approvals or []
            ).SerializeToString()
        return self._lifecycle(kind, payload)

    def _ended(self, ending: pb.StreamEvent) -> pb.StreamEvent:
        """The event the Response was built in, as the terminal event: the Response in it is
        final, and nothing changes it after."""
        seq = ending.sequence_number = self._next()
        if self._echoes_tools():
            wire = (
                b"\x08"
                + varint(seq)
                + length_delimited(_EVENT_FIELDS["completed"].number, length_delimited(1, self._serialized()))
            )
            self._wire = [(ending, wire)]
        return ending

    def _copied(self, kind: str) -> pb.StreamEvent:
        # Filled in place: a message passed to a constructor is copied by serializing and parsing
        # it (upb), which costs several times a CopyFrom.
        event = pb.StreamEvent(sequence_number=self._next())
        getattr(event, kind).response.CopyFrom(self.response)
        return event

    def heavy(self) -> bool:
        """Whether a lifecycle event is costly to make: its echoed tools are so large that
        parsing the event from its bytes (about 8 ms a MiB) would hold the event loop."""
        return self._echoes_tools() and len(self._tools or b"") > HEAVY_TOOLS_BYTES

    def _echoes_tools(self) -> bool:
        if self._tools is None:
            tools = self.response.tools
            self._tools = echoed_tools(tools) if tools else b""
        return bool(self._tools)

    def _serialized(self) -> bytes:
        """The Response on the wire, its echoed tools serialized the first time only."""
        response = self.response
        assert self._tools is not None
        # Fields may come in any order on the wire; the other fields are small, or change.
        rest = pb.Response()
        parts = []
        for described, value in response.ListFields():
            number = described.number
            if number == _TOOLS:
                continue
            if number in _MESSAGES:
                parts.append(length_delimited(number, value.SerializeToString()))
            elif number in _REPEATED_MESSAGES:
                parts += [length_delimited(number, item.SerializeToString()) for item in value]
            elif number == _METADATA:
                rest.metadata.update(value)
            else:
                setattr(rest, described.name, value)
        return rest.SerializeToString() + b"".join(parts) + self._tools

    def _lifecycle(self, kind: str, payload: bytes) -> pb.StreamEvent:
        wire = b"\x08" + varint(self._next()) + length_delimited(_EVENT_FIELDS[kind].number, payload)
        event = pb.StreamEvent.FromString(wire)
        self._wire = [(event, wire)]
        return event

    def take_wire(self, event: pb.StreamEvent) -> bytes | None:
        """The serialized form of `event`, once, when it is a lifecycle event made last (or
        `created` before `in_progress`) from bytes; None for any other event."""
        if not self._wire:
            return None
        for n, (kept, wire) in enumerate(self._wire):
            if kept is event:
                del self._wire[n]
                return wire
        return None

    # -- turns and controls ----------------------------------------------------------------------

    def turn_started(self, turn: int, round_: int) -> pb.StreamEvent:
        event = pb.StreamEvent(sequence_number=self._next())
        started = event.turn_started
        started.turn, started.round = turn, round_
        return event

    def turn_decided(self, turn: int, decision: int, tool_calls: int = 0) -> pb.StreamEvent:
        event = pb.StreamEvent(sequence_number=self._next())
        decided = event.turn_decided
        decided.turn, decided.decision, decided.tool_calls = turn, decision, tool_calls  # type: ignore[assignment]
        return event

    def turn_completed(self, turn: int, seconds: float, interrupted: str = "") -> pb.StreamEvent:
        event = pb.StreamEvent(sequence_number=self._next())
        completed = event.turn_completed
        completed.turn = turn
        if interrupted:
            completed.interrupted = interrupted
        # Duration.FromNanoseconds is pure Python and shows in profiles; this is the same.
        completed.duration.seconds, completed.duration.nanos = divmod(int(seconds * 1e9), 1_000_000_000)
        return event

    def approval_requested(self, requests: list[pb.ApprovalRequest]) -> pb.StreamEvent:
        return pb.StreamEvent(
            sequence_number=self._next(), approval_requested=pb.ApprovalRequestedEvent(requests=requests)
        )

    def paused(self, reason: str) -> pb.StreamEvent:
        return pb.StreamEvent(sequence_number=self._next(), paused=pb.PausedEvent(reason=reason))

    def hook_failed(self, failure: pb.HookFailedEvent) -> pb.StreamEvent:
        return pb.StreamEvent(sequence_number=self._next(), hook_failed=failure)

    def resumed(self) -> pb.StreamEvent:
        return pb.StreamEvent(sequence_number=self._next(), resumed=pb.ResumedEvent())

    def input_injected(self, kind: int, items: list[pb.Item], superseded: list[str]) -> pb.StreamEvent:
        return pb.StreamEvent(
            sequence_number=self._next(),
            input_injected=pb.InputInjectedEvent(kind=kind, items=items, superseded_call_ids=superseded),  # type: ignore[arg-type]
        )

    # -- a background run resumed on another replica (engine/durable.py) --------------------------

    def recovered(self, after_sequence: int, from_turn: int, reason: str) -> pb.StreamEvent:
        """The first event of a resumed run: numbering goes on after the last logged event."""
        self._seq = after_sequence
        recovered = pb.ResponseRecoveredEvent(from_turn=from_turn, reason=reason, last_sequence_number=after_sequence)
        return pb.StreamEvent(sequence_number=self._next(), recovered=recovered)

    def reopen(self, index: int, part: int) -> bool:
        """An item of the Response the lost replica had begun and left open, open here again with
        the content it had (`part`: its content part left open, -1: none), so that `close_turn`
        closes it as any open item. False for an item that is never streamed (`superseded`
        closes it)."""
        item = self.response.output[index]
        which = item.WhichOneof("kind")
        if which == "message":
            msg = self._message = _OpenMessage(item, index, item.id)
            if part >= 0:
                content = item.message.content[part]
                msg.part_index, msg.part_kind = part, content.WhichOneof("part") or "output_text"
                msg.fragments = [content.refusal.refusal if msg.part_kind == "refusal" else content.output_text.text]
        elif which == "reasoning":
            self._reasoning = _OpenItem(item, index, item.id, [item.reasoning.text])
        elif which == "function_call":
            self._calls[index] = _OpenItem(item, index, item.id, [item.function_call.arguments])
        else:
            return False
        return True

    def superseded(self, index: int) -> pb.StreamEvent:
        """An item the lost replica had begun and left open, of a kind that is never streamed:
        done, incomplete."""
        item = self.response.output[index]
        item.status = INCOMPLETE
        return self._item_event("output_item_done", index, item)

    def tool_interrupted(self, execution: pb.ToolExecutionInProgressEvent, error: str) -> pb.StreamEvent:
        """A tool execution the lost replica had begun and not ended: failed."""
        failed = pb.ToolExecutionFailedEvent(
            item_id=execution.item_id, output_index=execution.output_index, call_id=execution.call_id, error=error
        )
        return pb.StreamEvent(sequence_number=self._next(), tool_execution_failed=failed)

    # -- whole items ---------------------------------------------------------------------------

    def add_item(self, item: pb.Item) -> list[pb.StreamEvent]:
        """An item that arrives complete (non-streaming turns, tool outputs): added, then done."""
        if not item.id:
            item.id = new_item_id(item.WhichOneof("kind") or "message")
        item.status = COMPLETED
        index = len(self.response.output)
        stored = self.response.output.add()
        stored.CopyFrom(item)
        self.turn_items.append(stored)
        return [
            self._item_event("output_item_added", index, stored),
            self._item_event("output_item_done", index, stored),
        ]

    def _open(self, prefix: str) -> tuple[pb.Item, int]:
        index = len(self.response.output)
        item = self.response.output.add()
        item.id = new_id(prefix)
        item.status = IN_PROGRESS
        return item, index

    # -- streamed deltas -----------------------------------------------------------------------

    def on_text(
        self, text: str, kind: str = "output_text", logprobs: Sequence[pb.TokenLogprob] = ()
    ) -> list[pb.StreamEvent]:
        events: list[pb.StreamEvent] = []
        if self._reasoning is not None:
            events += self._close_reasoning(COMPLETED)
        msg = self._message
        if msg is None:
            item, index = self._open("msg")
            item.message.role = ASSISTANT
            msg = self._message = _OpenMessage(item, index, item.id)
            events.append(self._item_event("output_item_added", index, item))
        if msg.part_kind != kind:
            if msg.part_kind:
                events += self._close_part(msg)
            msg.part_index = len(msg.item.message.content)
            msg.part_kind = kind
            part = msg.item.message.content.add()
            getattr(part, kind).SetInParent()
            events.append(self._part_event("content_part_added", msg, part))
        msg.fragments.append(text)
        # Delta events are filled in place: a payload built apart is copied when passed in, and
        # these are most of a stream's events.
        event = pb.StreamEvent(sequence_number=self._next())
        delta = event.output_text_delta if kind == "output_text" else event.refusal_delta
        delta.item_id = msg.item_id
        delta.output_index = msg.index
        delta.content_index = msg.part_index
        delta.delta = text
        if logprobs:
            event.output_text_delta.logprobs.extend(logprobs)
            msg.item.message.content[msg.part_index].output_text.logprobs.extend(logprobs)
        events.append(event)
        return events

    def on_refusal(self, text: str) -> list[pb.StreamEvent]:
        return self.on_text(text, kind="refusal")

    def on_reasoning(self, text: str) -> list[pb.StreamEvent]:
        events: list[pb.StreamEvent] = []
        r = self._reasoning
        if r is None:
            item, index = self._open("rs")
            item.reasoning.SetInParent()
            r = self._reasoning = _OpenItem(item, index, item.id)
            events.append(self._item_event("output_item_added", index, item))
        r.fragments.append(text)
        event = pb.StreamEvent(sequence_number=self._next())
        delta = event.reasoning_text_delta
        delta.item_id = r.item_id
        delta.output_index = r.index
        delta.delta = text
        events.append(event)
        return events

    def on_tool_call(self, index: int, call_id: str | None, name: str | None, arguments: str) -> list[pb.StreamEvent]:
        events: list[pb.StreamEvent] = []
        call = self._calls.get(index)
        if call is None:
            events += self._close_message(COMPLETED)
            events += self._close_reasoning(COMPLETED)
            item, out_index = self._open("fc")
            item.function_call.call_id = call_id or new_id("call")
            item.function_call.name = name or ""
            call = self._calls[index] = _OpenItem(item, out_index, item.id)
            events.append(self._item_event("output_item_added", out_index, item))
        elif name and not call.item.function_call.name:
            call.item.function_call.name = name
        if arguments:
            call.fragments.append(arguments)
            event = pb.StreamEvent(sequence_number=self._next())
            delta = event.function_call_arguments_delta
            delta.item_id = call.item_id
            delta.output_index = call.index
            delta.delta = arguments
            events.append(event)
        return events

    def close_turn(self, status: int = COMPLETED) -> list[pb.StreamEvent]:
        """Close every open item (in output order). INCOMPLETE keeps partial content."""
        pending: list[tuple[int, str]] = []
        if self._message is not None:
            pending.append((self._message.index, "message"))
        if self._reasoning is not None:
            pending.append((self._reasoning.index, "reasoning"))
        pending += [(c.index, f"call:{key}") for key, c in self._calls.items()]
        events: list[pb.StreamEvent] = []
        for _, what in sorted(pending):
            if what == "message":
                events += self._close_message(status)
            elif what == "reasoning":
                events += self._close_reasoning(status)
            else:
                events += self._close_call(int(what[5:]), status)
        return events

    def start_turn(self) -> None:
        self.turn_items = []

    # -- closing -------------------------------------------------------------------------------

    def _close_part(self, msg: _OpenMessage) -> list[pb.StreamEvent]:
        text = "".join(msg.fragments)
        msg.fragments = []
        part = msg.item.message.content[msg.part_index]
        kind = msg.part_kind
        seq = self._next()
        if kind == "output_text":
            part.output_text.text = text
            done = pb.StreamEvent(sequence_number=seq)
            text_done = done.output_text_done
            text_done.item_id, text_done.output_index, text_done.content_index = msg.item_id, msg.index, msg.part_index
            text_done.text = text
        else:
            part.refusal.refusal = text
            done = pb.StreamEvent(
                sequence_number=seq,
                refusal_done=pb.RefusalDoneEvent(
                    item_id=msg.item.id, output_index=msg.index, content_index=msg.part_index, refusal=text
                ),
            )
        msg.part_kind = ""
        return [done, self._part_event("content_part_done", msg, part)]

    def _close_message(self, status: int) -> list[pb.StreamEvent]:
        msg = self._message
        if msg is None:
            return []
        self._message = None
        events = self._close_part(msg) if msg.part_kind else []
        return events + self._done(msg.item, msg.index, status)

    def _close_reasoning(self, status: int) -> list[pb.StreamEvent]:
        r = self._reasoning
        if r is None:
            return []
        self._reasoning = None
        text = "".join(r.fragments)
        r.item.reasoning.text = text
        done = pb.StreamEvent(
            sequence_number=self._next(),
            reasoning_text_done=pb.ReasoningTextDoneEvent(item_id=r.item.id, output_index=r.index, text=text),
        )
        return [done, *self._done(r.item, r.index, status)]

    def _close_call(self, key: int, status: int) -> list[pb.StreamEvent]:
        call = self._calls.pop(key)
        arguments = "".join(call.fragments)
        call.item.function_call.arguments = arguments
        done = pb.StreamEvent(
            sequence_number=self._next(),
            function_call_arguments_done=pb.FunctionCallArgumentsDoneEvent(
                item_id=call.item.id, output_index=call.index, arguments=arguments
            ),
        )
        return [done, *self._done(call.item, call.index, status)]

    def _done(self, item: pb.Item, index: int, status: int) -> list[pb.StreamEvent]:
        item.status = status  # type: ignore[assignment]
        self.turn_items.append(item)
        return [self._item_event("output_item_done", index, item)]

    def _item_event(self, kind: str, index: int, item: pb.Item) -> pb.StreamEvent:
        """output_item_added or output_item_done, filled in place."""
        event = pb.StreamEvent(sequence_number=self._next())
        payload = getattr(event, kind)
        payload.output_index = index
        payload.item.CopyFrom(item)
        return event

    def _part_event(self, kind: str, msg: _OpenMessage, part: pb.ContentPart) -> pb.StreamEvent:
        """content_part_added or content_part_done, filled in place."""
        event = pb.StreamEvent(sequence_number=self._next())
        payload = getattr(event, kind)
        payload.item_id, payload.output_index, payload.content_index = msg.item_id, msg.index, msg.part_index
        payload.part.CopyFrom(part)
        return event

    # -- tool execution progress ---------------------------------------------------------------

    def tool_started(self, item: pb.Item, index: int) -> pb.StreamEvent:
        return pb.StreamEvent(
            sequence_number=self._next(),
            tool_execution_in_progress=pb.ToolExecutionInProgressEvent(
                item_id=item.id,
                output_index=index,
                call_id=item.function_call.call_id,
                name=item.function_call.name,
            ),
        )

    def tool_progress(self, item: pb.Item, index: int, message: str) -> pb.StreamEvent:
        return pb.StreamEvent(
            sequence_number=self._next(),
            tool_execution_progress=pb.ToolExecutionProgressEvent(
                item_id=item.id, output_index=index, call_id=item.function_call.call_id, message=message
            ),
        )

    def tool_finished(
        self, item: pb.Item, index: int, result: pb.FunctionCallOutput, timed_out: bool = False
    ) -> pb.StreamEvent:
        seq = self._next()
        call_id = item.function_call.call_id
        if result.is_error:
            return pb.StreamEvent(
                sequence_number=seq,
                tool_execution_failed=pb.ToolExecutionFailedEvent(
                    item_id=item.id, output_index=index, call_id=call_id, error=result.output, timed_out=timed_out
                ),
            )
        return pb.StreamEvent(
            sequence_number=seq,
            tool_execution_completed=pb.ToolExecutionCompletedEvent(
                item_id=item.id, output_index=index, call_id=call_id
            ),
        )


def echoed_tools(tools: Sequence[pb.Tool]) -> bytes:
    """`tools` as the `tools` field of a Response on the wire."""
    return b"".join([length_delimited(_TOOLS, tool.SerializeToString()) for tool in tools])


def new_item_id(kind: str) -> str:
    """A new id for an output item of this kind ("function_call_output": "fco_…")."""
    return new_id(_PREFIX[kind])


_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
    "approval_request": "apreq",
    "approval_response": "apres",
}
