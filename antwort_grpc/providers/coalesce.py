"""Adaptive delta coalescing: deltas that are already waiting leave as one.

A provider that reads its backend in blocks (an SSE stream read from a socket) sees how far behind
the gateway is: while the gateway writes an event to a slow client, or while the event loop is
busy, the backend's next chunks pile up in the socket, and the next read returns several of them.
`merge_deltas` joins consecutive deltas of one content part from such a read into one delta, so
the gateway sends one fuller event instead of one per chunk. A read with one chunk (nothing
waited) passes through as it is: coalescing never delays a delta, unless the request asks for a
hold (`max_hold`).

The text is joined, never changed, so the text a client reassembles is byte-identical; the
emitter turns the merged deltas into the same items and parts, with dense sequence numbers.
"""

from __future__ import annotations

from antwort_grpc import pb
from antwort_grpc.providers.base import ProviderEvent, ReasoningDelta, RefusalDelta, TextDelta, ToolCallDelta

# A merged delta stops growing at this many characters: each event stays small next to any
# client's message size limit, and a slow client still sees steady progress.
MAX_MERGED = 16 * 1024
# The longest a request may ask a delta to be held for more of its part (seconds).
MAX_HOLD = 1.0


def max_hold_of(request: pb.CreateResponseRequest) -> float:
    """The request's hold in seconds (0: deltas never wait)."""
    hold = request.delta_coalescing.max_hold
    return hold.seconds + hold.nanos / 1e9


# Tuples, not unions: isinstance with a tuple is the cheaper check, and these run per chunk.
_TEXTS = (TextDelta, ReasoningDelta, RefusalDelta)
# The deltas that may be joined with the next of their part (a turn's end never is).
MERGEABLE = (*_TEXTS, ToolCallDelta)


def mergeable(event: ProviderEvent) -> bool:
    """Whether more of the same part could still be joined to `event`."""
    return isinstance(event, MERGEABLE)


def merge_deltas(events: list[ProviderEvent], limit: int = MAX_MERGED) -> list[ProviderEvent]:
    """`events` with each run of consecutive deltas of one part joined into one delta (at most
    `limit` characters, unless a single delta is longer)."""
    if len(events) < 2:
        return events
    merged: list[ProviderEvent] = []
    texts: list[str] = []
    size = 0
    head: ProviderEvent | None = None
    for event in events:
        if head is not None and size + delta_size(event) <= limit and _same_part(head, event):
            texts.append(_text(event))
            size += delta_size(event)
            continue
        if head is not None:
            merged.append(_joined(head, texts))
        head, texts, size = event, [_text(event)], delta_size(event)
    if head is not None:
        merged.append(_joined(head, texts))
    return merged


def _same_part(head: ProviderEvent, event: ProviderEvent) -> bool:
    kind = type(head)
    if type(event) is not kind:
        return False
    if kind is ToolCallDelta:
        assert isinstance(head, ToolCallDelta) and isinstance(event, ToolCallDelta)
        # A fragment that names a call starts that call: it never joins an earlier one.
        return event.index == head.index and event.call_id is None and event.name is None
    if kind is TextDelta:
        # Deltas that carry log probabilities stay apart: each keeps its own tokens'.
        return not head.logprobs and not event.logprobs  # type: ignore[union-attr]
    return kind in (ReasoningDelta, RefusalDelta)


def _text(event: ProviderEvent) -> str:
    if isinstance(event, _TEXTS):
        return event.text
    if isinstance(event, ToolCallDelta):
        return event.arguments
    return ""


def delta_size(event: ProviderEvent) -> int:
    """Characters of text a delta carries (0 for other events)."""
    return len(_text(event))


def _joined(head: ProviderEvent, texts: list[str]) -> ProviderEvent:
    if len(texts) == 1:
        return head
    text = "".join(texts)
    if isinstance(head, ToolCallDelta):
        return ToolCallDelta(head.index, text, call_id=head.call_id, name=head.name)
    if isinstance(head, TextDelta):
        return TextDelta(text)
    if isinstance(head, ReasoningDelta):
        return ReasoningDelta(text)
    assert isinstance(head, RefusalDelta)
    return RefusalDelta(text)
