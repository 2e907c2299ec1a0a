"""The context window: which items of a conversation the model sees when it all does not fit.

Pure: a function of the items, the instructions and the limits, tested with properties.

The rules, in order of precedence:
  - system and developer messages and the instructions are always kept;
  - the newest items are kept, the oldest left out;
  - a `function_call` and its `function_call_output` stay together: a cut that would part them
    moves later (leaving out more) to the next safe boundary, so the window never holds an output
    whose call it lacks (Chat Completions backends reject that);
  - when even the newest complete exchange does not fit, it is kept anyway: the model always gets
    something to answer, and a backend that still finds it too long says so.

Tokens are estimated from the serialized size (about four bytes a token): a budget, not a count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from antwort_grpc import pb

# Bytes per token of the estimate, and a per-item overhead (role and framing the backend adds).
BYTES_PER_TOKEN = 4
ITEM_OVERHEAD_TOKENS = 4

_PINNED_ROLES = frozenset({pb.Role.ROLE_SYSTEM, pb.Role.ROLE_DEVELOPER})


@dataclass(frozen=True, slots=True)
class WindowLimits:
    """None: no limit of that kind."""

    max_items: int | None = None
    max_tokens: int | None = None

    @property
    def unlimited(self) -> bool:
        return self.max_items is None and self.max_tokens is None


UNLIMITED = WindowLimits()


@dataclass(frozen=True, slots=True)
class Window:
    items: list[pb.Item]
    # How many items of the conversation were left out.
    omitted: int
    # The estimate for what is kept, instructions included.
    tokens: int


def estimate_tokens(item: pb.Item) -> int:
    return item.ByteSize() // BYTES_PER_TOKEN + ITEM_OVERHEAD_TOKENS


def text_tokens(text: str) -> int:
    return len(text.encode()) // BYTES_PER_TOKEN


def is_pinned(item: pb.Item) -> bool:
    return item.WhichOneof("kind") == "message" and item.message.role in _PINNED_ROLES


def apply_window(items: Sequence[pb.Item], instructions: str, limits: WindowLimits) -> Window:
    """The items the model sees under `limits`, in their original order."""
    sizes = [estimate_tokens(i) for i in items]
    fixed = text_tokens(instructions)
    if limits.unlimited:
        return Window(list(items), 0, fixed + sum(sizes))
    pinned = [n for n, item in enumerate(items) if is_pinned(item)]
    rest = [n for n, item in enumerate(items) if not is_pinned(item)]
    fixed += sum(sizes[n] for n in pinned)
    start = _tail_start(sizes, len(pinned), rest, fixed, limits)
    chosen = _safe_start(_safe_starts(items, rest), start, len(rest))
    if chosen == 0:
        return Window(list(items), 0, fixed + sum(sizes[n] for n in rest))
    keep = set(pinned) | set(rest[chosen:])
    kept = [item for n, item in enumerate(items) if n in keep]
    return Window(kept, chosen, fixed + sum(sizes[n] for n in rest[chosen:]))


def _tail_start(sizes: list[int], pinned: int, rest: list[int], fixed: int, limits: WindowLimits) -> int:
    """The earliest start (an index into `rest`) whose tail fits next to the pinned items."""
    max_items = limits.max_items if limits.max_items is not None else pinned + len(rest)
    max_tokens = limits.max_tokens if limits.max_tokens is not None else fixed + sum(sizes)
    start = len(rest)
    tokens = fixed
    while start > 0:
        candidate = tokens + sizes[rest[start - 1]]
        if pinned + len(rest) - start + 1 > max_items or candidate > max_tokens:
            break
        start -= 1
        tokens = candidate
    return start


def _safe_start(safe: list[int], start: int, end: int) -> int:
    """The first safe start at or after `start`; when nothing fits whole, the newest complete
    exchange rather than nothing."""
    chosen = next((s for s in safe if s >= start), end)
    if chosen == end and end:
        chosen = max((s for s in safe if s < end), default=end)
    return chosen


def _safe_starts(items: Sequence[pb.Item], rest: list[int]) -> list[int]:
    """Ascending positions s in `rest` where the tail rest[s:] may begin: it does not begin with an
    output, and every output in it whose call the conversation holds has that call in the tail too.

    Scanning from the end, `open` holds the outputs seen whose calls are further back. (An output
    whose call is nowhere in the conversation is the client's business, not a reason to cut.)
    """
    calls = {i.function_call.call_id for i in items if i.WhichOneof("kind") == "function_call"}
    open_outputs: set[str] = set()
    safe = [len(rest)]
    for s in range(len(rest) - 1, -1, -1):
        item = items[rest[s]]
        kind = item.WhichOneof("kind")
        if kind == "function_call_output":
            if item.function_call_output.call_id in calls:
                open_outputs.add(item.function_call_output.call_id)
        elif kind == "function_call":
            open_outputs.discard(item.function_call.call_id)
        if not open_outputs and kind != "function_call_output":
            safe.append(s)
    safe.reverse()
    return safe


def smaller(limits: WindowLimits, window: Window) -> WindowLimits:
    """Limits for a retry after the backend said the context was too long: half of what was sent."""
    kept = len(window.items)
    return WindowLimits(
        max_items=max(1, min(limits.max_items or kept, kept) // 2),
        max_tokens=max(1, min(limits.max_tokens or window.tokens, window.tokens) // 2),
    )


class ContextWindow:
    """The window of one response: its limits (smaller after a backend said the context was too
    long) and the most items any model call left out. No I/O: the model-call site asks it."""

    __slots__ = ("limits", "omitted")

    def __init__(self, limits: WindowLimits) -> None:
        self.limits = limits
        self.omitted = 0

    def view(self, items: Sequence[pb.Item], instructions: str) -> tuple[pb.Item, ...]:
        """What the model sees of the conversation."""
        if self.limits.unlimited:
            return tuple(items)
        window = apply_window(items, instructions, self.limits)
        self.omitted = max(self.omitted, window.omitted)
        return tuple(window.items)

    def shrink(self, items: Sequence[pb.Item], instructions: str) -> tuple[pb.Item, ...]:
        """`items` were too long for the backend: the limits halve, and what the model sees now."""
        sent = apply_window(items, instructions, UNLIMITED)
        self.limits = smaller(self.limits, sent)
        return self.view(items, instructions)
