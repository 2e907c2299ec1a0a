"""What one run did and where its time went, kept as plain numbers while it runs and written into
the Response's RunMetrics whenever the response is saved and when it ends."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from google.protobuf.duration_pb2 import Duration

from antwort_grpc import pb


@dataclass(slots=True)
class _Tool:
    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    seconds: float = 0.0
    longest: float = 0.0


@dataclass(slots=True)
class RunRecorder:
    started: float = field(default_factory=time.perf_counter)
    turns: int = 0
    model_calls: int = 0
    model_seconds: float = 0.0
    tool_seconds: float = 0.0
    tools: dict[str, _Tool] = field(default_factory=dict)
    # Per model call: turn, (input, output, total) tokens, seconds, answered by a hook.
    turn_metrics: list[tuple[int, tuple[int, int, int], float, bool]] = field(default_factory=list)
    # The model call under way: when it started and the response's usage then.
    _model_started: float = 0.0
    _usage_before: tuple[int, int, int] = (0, 0, 0)

    def model_started(self, usage: pb.Usage) -> None:
        self._model_started = time.perf_counter()
        self._usage_before = (usage.input_tokens, usage.output_tokens, usage.total_tokens)

    def model_ended(self, turn: int, usage: pb.Usage, *, by_hook: bool) -> tuple[int, int, int]:
        """The model call of `turn` ended with the response's usage at `usage`: what it spent."""
        before = self._usage_before
        spent = (usage.input_tokens - before[0], usage.output_tokens - before[1], usage.total_tokens - before[2])
        self.model_call(turn, spent, time.perf_counter() - self._model_started, by_hook=by_hook)
        return spent

    def model_call(self, turn: int, tokens: tuple[int, int, int], seconds: float, *, by_hook: bool = False) -> None:
        """One model call (or a hook's answer in its place) of turn `turn`."""
        if not by_hook:
            self.model_calls += 1
            self.model_seconds += seconds
        self.turn_metrics.append((turn, tokens, seconds, by_hook))

    def tool_call(self, name: str, seconds: float, *, is_error: bool, timed_out: bool = False) -> None:
        tool = self.tools.setdefault(name, _Tool())
        tool.calls += 1
        tool.errors += is_error
        tool.timeouts += timed_out
        tool.seconds += seconds
        tool.longest = max(tool.longest, seconds)
        self.tool_seconds += seconds

    @property
    def tool_calls(self) -> int:
        return sum(t.calls for t in self.tools.values())

    def write(self, metrics: pb.RunMetrics, hooks: tuple[int, int, float] = (0, 0, 0.0)) -> None:
        """Into `metrics`, replacing what it held; `hooks`: the hook calls, failures and seconds
        so far (the hooks' own run keeps the running sums)."""
        hook_calls, hook_failures, hook_seconds = hooks
        metrics.Clear()
        metrics.turns = self.turns
        metrics.model_calls = self.model_calls
        if self.tools:
            metrics.tool_calls = self.tool_calls
            metrics.tool_errors = sum(t.errors for t in self.tools.values())
            metrics.tool_timeouts = sum(t.timeouts for t in self.tools.values())
        _set(metrics.model_time, self.model_seconds)
        _set(metrics.tool_time, self.tool_seconds)
        _set(metrics.hook_time, hook_seconds)
        metrics.hook_calls = hook_calls
        metrics.hook_failures = hook_failures
        _set(metrics.duration, time.perf_counter() - self.started)
        for name, tool in self.tools.items():
            entry = metrics.tools.add(name=name, calls=tool.calls, errors=tool.errors, timeouts=tool.timeouts)
            _set(entry.time, tool.seconds)
            _set(entry.max_time, tool.longest)
        for turn, (input_tokens, output_tokens, total_tokens), seconds, by_hook in self.turn_metrics:
            call = metrics.turn_metrics.add(turn=turn, answered_by_hook=by_hook)
            usage = call.usage
            usage.input_tokens, usage.output_tokens, usage.total_tokens = input_tokens, output_tokens, total_tokens
            _set(call.model_time, seconds)


def _set(duration: Duration, seconds: float) -> None:
    # Duration.FromNanoseconds is pure Python and shows in profiles; this is the same.
    duration.seconds, duration.nanos = divmod(int(seconds * 1e9), 1_000_000_000)
