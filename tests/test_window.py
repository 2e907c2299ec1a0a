"""The context window: properties over any conversation, and a table of cases."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from antwort_grpc import pb
from antwort_grpc.engine.window import (
    Window,
    WindowLimits,
    apply_window,
    estimate_tokens,
    is_pinned,
    smaller,
    text_tokens,
)

R = pb.Role
_ids = itertools.count()


def message(role: int, text: str = "hi") -> pb.Item:
    part = pb.ContentPart(input_text=pb.InputText(text=text))
    return pb.Item(id=f"msg_{next(_ids)}", message=pb.Message(role=role, content=[part]))  # type: ignore[arg-type]


def call(call_id: str, arguments: str = "{}") -> pb.Item:
    return pb.Item(id=f"fc_{call_id}", function_call=pb.FunctionCall(call_id=call_id, name="t", arguments=arguments))


def output(call_id: str, text: str = "ok") -> pb.Item:
    return pb.Item(id=f"fco_{call_id}", function_call_output=pb.FunctionCallOutput(call_id=call_id, output=text))


def names(items: Sequence[pb.Item]) -> list[str]:
    return [i.id.split("_")[0] + ":" + (i.function_call.call_id or i.function_call_output.call_id) for i in items]


# -- properties -------------------------------------------------------------------------------------


@st.composite
def conversations(draw: st.DrawFn) -> list[pb.Item]:
    """Valid conversations: messages of every role, reasoning, and groups of parallel calls each
    followed by all their outputs (in any order, perhaps with a message between), and perhaps a
    last group still waiting for its outputs."""
    items: list[pb.Item] = []
    counter = itertools.count()
    for _ in range(draw(st.integers(0, 14))):
        kind = draw(st.sampled_from(["user", "assistant", "system", "developer", "reasoning", "calls"]))
        text = draw(st.text(max_size=40))
        if kind == "calls":
            ids = [f"c{next(counter)}" for _ in range(draw(st.integers(1, 3)))]
            items += [call(i, text) for i in ids]
            if draw(st.booleans()):
                items.append(message(R.ROLE_ASSISTANT, "while calling"))
            items += [output(i, text) for i in draw(st.permutations(ids))]
        elif kind == "reasoning":
            items.append(pb.Item(id=f"rs_{next(_ids)}", reasoning=pb.Reasoning(text=text)))
        else:
            role = {"user": R.ROLE_USER, "assistant": R.ROLE_ASSISTANT, "system": R.ROLE_SYSTEM}.get(
                kind, R.ROLE_DEVELOPER
            )
            items.append(message(role, text))
    if draw(st.booleans()):
        items.append(call(f"c{next(counter)}"))  # awaiting its output
    return items


limits_strategy = st.builds(
    WindowLimits,
    max_items=st.one_of(st.none(), st.integers(1, 20)),
    max_tokens=st.one_of(st.none(), st.integers(1, 400)),
)


def orphans(items: Sequence[pb.Item]) -> list[str]:
    seen: set[str] = set()
    found = []
    for item in items:
        if item.WhichOneof("kind") == "function_call":
            seen.add(item.function_call.call_id)
        elif item.WhichOneof("kind") == "function_call_output" and item.function_call_output.call_id not in seen:
            found.append(item.function_call_output.call_id)
    return found


@settings(max_examples=400, deadline=None)
@given(items=conversations(), limits=limits_strategy, instructions=st.text(max_size=200))
def test_window_never_holds_an_output_without_its_call(
    items: list[pb.Item], limits: WindowLimits, instructions: str
) -> None:
    window = apply_window(items, instructions, limits)
    assert orphans(window.items) == []
    unpinned = [i for i in window.items if not is_pinned(i)]
    assert not unpinned or unpinned[0].WhichOneof("kind") != "function_call_output"


@settings(max_examples=400, deadline=None)
@given(items=conversations(), limits=limits_strategy, instructions=st.text(max_size=200))
def test_window_always_keeps_system_and_developer_messages(
    items: list[pb.Item], limits: WindowLimits, instructions: str
) -> None:
    window = apply_window(items, instructions, limits)
    assert [i.id for i in window.items if is_pinned(i)] == [i.id for i in items if is_pinned(i)]


@settings(max_examples=400, deadline=None)
@given(items=conversations(), limits=limits_strategy, instructions=st.text(max_size=200))
def test_window_is_idempotent(items: list[pb.Item], limits: WindowLimits, instructions: str) -> None:
    once = apply_window(items, instructions, limits)
    twice = apply_window(once.items, instructions, limits)
    assert twice.items == once.items
    assert twice.omitted == 0


@settings(max_examples=400, deadline=None)
@given(items=conversations(), limits=limits_strategy, instructions=st.text(max_size=200))
def test_window_keeps_the_newest_items_in_order_and_counts_the_rest(
    items: list[pb.Item], limits: WindowLimits, instructions: str
) -> None:
    window = apply_window(items, instructions, limits)
    kept = [i.id for i in window.items if not is_pinned(i)]
    unpinned = [i.id for i in items if not is_pinned(i)]
    assert kept == unpinned[len(unpinned) - len(kept) :], "the kept items are the newest ones"
    assert [i.id for i in window.items] == [i.id for i in items if i.id in set(kept) or is_pinned(i)]
    assert window.omitted == len(items) - len(window.items)


@settings(max_examples=400, deadline=None)
@given(items=conversations(), limits=limits_strategy, instructions=st.text(max_size=200))
def test_window_fits_its_limits_or_is_the_newest_exchange_alone(
    items: list[pb.Item], limits: WindowLimits, instructions: str
) -> None:
    window = apply_window(items, instructions, limits)
    assert window.tokens == text_tokens(instructions) + sum(estimate_tokens(i) for i in window.items)
    fits = (limits.max_items is None or len(window.items) <= limits.max_items) and (
        limits.max_tokens is None or window.tokens <= limits.max_tokens
    )
    if not fits:
        # Over the limits only when no shorter tail could start safely: dropping the oldest kept
        # item and re-windowing without limits on that smaller tail would leave an orphan or nothing.
        tail = [i for i in window.items if not is_pinned(i)]
        for cut in range(1, len(tail)):
            shorter = tail[cut:]
            assert orphans(shorter) or shorter[0].WhichOneof("kind") == "function_call_output", (
                f"a shorter safe tail existed at {cut}"
            )


# -- cases --------------------------------------------------------------------------------------------


def test_no_limits_keep_everything() -> None:
    items = [message(R.ROLE_USER), call("a"), output("a"), message(R.ROLE_ASSISTANT)]
    window = apply_window(items, "be brief", WindowLimits())
    assert window.items == items and window.omitted == 0


def test_conversation_within_the_limits_is_unchanged() -> None:
    items = [message(R.ROLE_USER), call("a"), output("a"), message(R.ROLE_ASSISTANT)]
    assert apply_window(items, "", WindowLimits(max_items=4, max_tokens=10_000)) == apply_window(
        items, "", WindowLimits()
    )


CASES: list[tuple[str, list[pb.Item], WindowLimits, list[str], int]] = [
    (
        "the oldest items go first",
        [message(R.ROLE_USER), message(R.ROLE_ASSISTANT), message(R.ROLE_USER)],
        WindowLimits(max_items=2),
        ["msg:", "msg:"],
        1,
    ),
    (
        "a cut between a call and its output moves after the output",
        [message(R.ROLE_USER), call("a"), output("a"), message(R.ROLE_ASSISTANT)],
        WindowLimits(max_items=2),
        ["msg:"],
        3,
    ),
    (
        "parallel calls stay with all their outputs",
        [message(R.ROLE_USER), call("a"), call("b"), output("a"), output("b"), message(R.ROLE_USER)],
        WindowLimits(max_items=5),
        ["fc:a", "fc:b", "fco:a", "fco:b", "msg:"],
        1,
    ),
    (
        "when only a call group is left it is kept whole, over the limit",
        [message(R.ROLE_USER), call("a"), call("b"), output("b"), output("a")],
        WindowLimits(max_items=1),
        ["fc:a", "fc:b", "fco:b", "fco:a"],
        1,
    ),
    (
        "a call still waiting for its output may be the whole window",
        [message(R.ROLE_USER), call("a"), output("a"), call("b")],
        WindowLimits(max_items=1),
        ["fc:b"],
        3,
    ),
    (
        "system and developer messages stay where they were",
        [message(R.ROLE_SYSTEM), message(R.ROLE_USER), message(R.ROLE_DEVELOPER), message(R.ROLE_USER)],
        WindowLimits(max_items=3),
        ["msg:", "msg:", "msg:"],
        1,
    ),
    (
        "an output whose call the conversation lacks never starts the window",
        [output("gone"), message(R.ROLE_USER)],
        WindowLimits(max_items=5),
        ["msg:"],
        1,
    ),
]


@pytest.mark.parametrize(("items", "limits", "expected", "omitted"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_window_cases(items: list[pb.Item], limits: WindowLimits, expected: list[str], omitted: int) -> None:
    window = apply_window(items, "", limits)
    assert names(window.items) == expected
    assert window.omitted == omitted


def test_pinned_roles_survive_a_cut_that_drops_everything_around_them() -> None:
    system = message(R.ROLE_SYSTEM, "rules")
    items = [message(R.ROLE_USER), system, message(R.ROLE_USER), message(R.ROLE_USER, "latest")]
    window = apply_window(items, "", WindowLimits(max_items=2))
    assert [i.id for i in window.items] == [system.id, items[-1].id]


def test_token_limit_counts_the_instructions() -> None:
    items = [message(R.ROLE_USER, "x" * 400), message(R.ROLE_USER, "y" * 40)]
    room = estimate_tokens(items[1]) + estimate_tokens(items[0])
    assert apply_window(items, "", WindowLimits(max_tokens=room)).omitted == 0
    assert apply_window(items, "z" * 40, WindowLimits(max_tokens=room)).omitted == 1


def test_retry_window_is_half_of_what_was_sent() -> None:
    sent = Window(items=[message(R.ROLE_USER)] * 8, omitted=0, tokens=1000)
    assert smaller(WindowLimits(), sent) == WindowLimits(max_items=4, max_tokens=500)
    assert smaller(WindowLimits(max_items=6, max_tokens=300), sent) == WindowLimits(max_items=3, max_tokens=150)
    tiny = Window(items=[message(R.ROLE_USER)], omitted=0, tokens=1)
    assert smaller(WindowLimits(), tiny) == WindowLimits(max_items=1, max_tokens=1)
