"""A run as it happens, for people (styled with rich; plain text in a pipe) or for scripts (--json).

Text streams in as it arrives; reasoning is dimmed; each tool call shows its arguments, its
progress and its result; injected input, pauses and approvals get a line each; the run ends with
its status, the response id, usage and timing. Model output is printed as text, never as markup.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Protocol

from google.protobuf.json_format import MessageToDict
from rich.console import Console
from rich.text import Text

from antwort_grpc import pb
from antwort_grpc.event_kinds import TERMINAL_EVENTS as TERMINAL

_STATUS_STYLE = {
    "completed": "bold green",
    "requires_action": "bold yellow",
    "incomplete": "bold yellow",
    "cancelled": "bold yellow",
    "failed": "bold red",
}
_RESULT_PREVIEW = 300


class Renderer(Protocol):
    def event(self, event: pb.StreamEvent) -> None: ...

    def rejected(self, rejected: pb.ControlRejected) -> None: ...

    def note(self, text: str) -> None: ...


def status_name(response: pb.Response) -> str:
    return pb.ResponseStatus.Name(response.status).removeprefix("RESPONSE_STATUS_").lower()


def terminal_response(event: pb.StreamEvent) -> pb.Response | None:
    kind = event.WhichOneof("event")
    if kind not in TERMINAL:
        return None
    response: pb.Response = getattr(event, kind).response
    return response


class JsonRenderer:
    """One JSON object per line: each event as the protobuf JSON mapping, rejections as
    {"rejected": …}. Nothing else goes to stdout."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def _line(self, data: object) -> None:
        self.console.out(json.dumps(data, ensure_ascii=False), highlight=False)

    def event(self, event: pb.StreamEvent) -> None:
        self._line(MessageToDict(event, preserving_proto_field_name=True))

    def rejected(self, rejected: pb.ControlRejected) -> None:
        self._line({"rejected": MessageToDict(rejected, preserving_proto_field_name=True)})

    def note(self, text: str) -> None:
        pass


class HumanRenderer:
    def __init__(self, console: Console) -> None:
        self.console = console
        self.started = time.monotonic()
        self.mid_line = False
        self._streaming: str | None = None  # "text" or "reasoning" while deltas arrive
        # Whole lines only (set while an input line is drawn below the output: a partial line
        # would be redrawn under it); the line being streamed waits here until it is complete.
        self.buffered = False
        self._partial = Text()
        # Shows the line being streamed while it waits (on the input line's first row), so a slow
        # model's words appear as they come; called with an empty Text once it is printed.
        self.show_partial: Callable[[Text], None] | None = None
        # Whether this run was seen from its start here; else (an attach, a retried create) its
        # time is the gateway's, from the response's timestamps.
        self._saw_start = False
        self._shown = False
        self.server_clock = False

    def restart_clock(self) -> None:
        self.started = time.monotonic()
        self._saw_start = self._shown = False

    def _inline(self, text: str, style: str = "") -> None:
        self._shown = True
        if self.buffered:
            self._partial.append(text, style)
            self._emit_whole_lines()
            self.mid_line = bool(self._partial.plain)
            if self.show_partial is not None:
                self.show_partial(self._partial)
            return
        self.console.print(Text(text, style=style), end="", soft_wrap=True)
        self.mid_line = not text.endswith("\n")

    def _emit_whole_lines(self) -> None:
        width = max(self.console.width, 20)
        while True:
            plain = self._partial.plain
            if "\n" in plain:
                cut, skip = plain.index("\n"), 1
            elif len(plain) >= width:
                space = plain.rfind(" ", 0, width)
                cut, skip = (space, 1) if space > 0 else (width, 0)
            else:
                return
            self.console.print(self._partial[:cut], soft_wrap=True)
            self._partial = self._partial[cut + skip :]

    def end_line(self) -> None:
        """End the line being streamed, if one is."""
        if self.mid_line:
            if self.buffered:
                self.console.print(self._partial, soft_wrap=True)
                self._partial = Text()
                if self.show_partial is not None:
                    self.show_partial(self._partial)
            else:
                self.console.print()
            self.mid_line = False

    def line(self, text: str | Text, style: str = "") -> None:
        self.end_line()
        self._streaming = None
        self.console.print(text if isinstance(text, Text) else Text(text, style=style), soft_wrap=True)

    def note(self, text: str) -> None:
        self.line(text, "dim")

    def rejected(self, rejected: pb.ControlRejected) -> None:
        violations = "; ".join(f"{v.field}: {v.description}" for v in rejected.field_violations)
        self.line(f"✗ not accepted: {rejected.message}" + (f" ({violations})" if violations else ""), "red")

    def event(self, event: pb.StreamEvent) -> None:
        kind = event.WhichOneof("event") or ""
        handler = getattr(self, f"_on_{kind}", None)
        if handler is not None:
            handler(getattr(event, kind))
        elif (response := terminal_response(event)) is not None:
            self._terminal(kind, response, event)

    def _delta(self, stream: str, delta: str, style: str) -> None:
        if self._streaming != stream:
            self.end_line()
        self._streaming = stream
        self._inline(delta, style)

    def _on_output_text_delta(self, e: pb.OutputTextDeltaEvent) -> None:
        self._delta("text", e.delta, "")

    def _on_refusal_delta(self, e: pb.RefusalDeltaEvent) -> None:
        self._delta("text", e.delta, "red")

    def _on_reasoning_text_delta(self, e: pb.ReasoningTextDeltaEvent) -> None:
        self._delta("reasoning", e.delta, "dim italic")

    def _on_created(self, e: pb.ResponseCreatedEvent) -> None:
        self._saw_start = True

    def _on_output_item_done(self, e: pb.OutputItemDoneEvent) -> None:
        self._shown = True
        kind = e.item.WhichOneof("kind")
        if kind == "function_call":
            call = e.item.function_call
            self.line(Text.assemble(("→ ", "cyan"), (call.name, "bold cyan"), (f" {call.arguments}", "cyan")))
        elif kind == "function_call_output":
            output = e.item.function_call_output
            preview = output.output if len(output.output) <= _RESULT_PREVIEW else output.output[:_RESULT_PREVIEW] + "…"
            style = "red" if output.is_error else "green"
            self.line(Text.assemble(("  ← ", style), (preview, style)))
        elif kind in ("message", "reasoning") and self.mid_line:
            self.end_line()
            self._streaming = None

    def _on_tool_execution_in_progress(self, e: pb.ToolExecutionInProgressEvent) -> None:
        self.line(f"  running {e.name} …", "dim")

    def _on_tool_execution_progress(self, e: pb.ToolExecutionProgressEvent) -> None:
        self.line(f"  · {e.message}", "dim")

    def _on_tool_execution_failed(self, e: pb.ToolExecutionFailedEvent) -> None:
        self.line(f"  ✗ {e.error}", "red")

    def _on_turn_started(self, e: pb.TurnStartedEvent) -> None:
        if e.turn > 1:
            self.line(f"── turn {e.turn}" + (f", round {e.round}" if e.round else ""), "dim")

    def _on_approval_requested(self, e: pb.ApprovalRequestedEvent) -> None:
        for request in e.requests:
            label = f" ({request.server_label})" if request.server_label else ""
            self.line(Text.assemble(("? ", "bold yellow"), (f"{request.name}{label} {request.arguments}", "yellow")))

    def _on_input_injected(self, e: pb.InputInjectedEvent) -> None:
        how = "steered" if e.kind == pb.InputKind.INPUT_KIND_STEER else "follow-up"
        texts = [
            part.input_text.text
            for item in e.items
            if item.WhichOneof("kind") == "message"
            for part in item.message.content
            if part.WhichOneof("part") == "input_text"
        ]
        self.line(f"↳ {how}: {' '.join(texts)}", "magenta")
        if e.superseded_call_ids:
            self.line(f"  superseded: {', '.join(e.superseded_call_ids)}", "dim")

    def _on_paused(self, e: pb.PausedEvent) -> None:
        self.line("‖ paused" + (f": {e.reason}" if e.reason else ""), "yellow")

    def _on_resumed(self, e: pb.ResumedEvent) -> None:
        self.line("▶ resumed", "yellow")

    def _on_recovered(self, e: pb.ResponseRecoveredEvent) -> None:
        if self.mid_line:
            self.end_line()
            self._streaming = None
        why = "its replica handed it over" if e.reason == "handed_over" else "its replica was lost"
        self.line(f"↻ recovered after turn {e.from_turn}: {why}; the turn in flight runs again", "yellow")

    def _terminal(self, kind: str, response: pb.Response, event: pb.StreamEvent) -> None:
        if not self._shown:
            self._output(response)  # a retried create's stored answer: no event showed it
        summary = (
            f"{status_name(response)} · {response.id} · {response.model} · {_usage(response)} · {self._took(response)}"
        )
        self.line(summary, _STATUS_STYLE.get(kind, "bold"))
        if kind == "failed":
            self.line(f"  {response.error.code}: {response.error.message}", "red")
        elif kind == "incomplete":
            self.line(f"  reason: {response.incomplete_details.reason}", "yellow")
        elif kind == "requires_action":
            for call in event.requires_action.tool_calls:
                self.line(f"  waiting for your result of {call.call_id}: {call.name} {call.arguments}", "yellow")
            for request in event.requires_action.approval_requests:
                self.line(
                    f"  waiting for a decision on {request.call_id}: {request.name} {request.arguments}", "yellow"
                )

    def _output(self, response: pb.Response) -> None:
        for item in response.output:
            if item.WhichOneof("kind") == "message":
                text = "".join(part.output_text.text for part in item.message.content)
                if text:
                    self.line(text)
            else:
                self._on_output_item_done(pb.OutputItemDoneEvent(item=item))

    def _took(self, response: pb.Response) -> str:
        """The client's clock for a run followed from its start; else the gateway's."""
        if (self.server_clock or not self._saw_start) and response.completed_at.seconds:
            took = response.completed_at.ToDatetime() - response.created_at.ToDatetime()
            return f"ran {took.total_seconds():.1f} s"
        return f"{time.monotonic() - self.started:.1f} s"


def _usage(response: pb.Response) -> str:
    usage = response.usage
    if (
        usage.input_tokens == usage.output_tokens == 0
        and response.status != pb.ResponseStatus.RESPONSE_STATUS_COMPLETED
    ):
        # A turn cut short (cancelled, failed) never got the model's count.
        return "tokens not counted"
    return f"{usage.input_tokens} in / {usage.output_tokens} out tokens"
