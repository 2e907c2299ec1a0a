"""What one run did and where its time went, kept as plain numbers while it runs and written into
the Response's RunMetrics whenever the response is saved and when it ends."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

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
    hook_calls: int = 0
    hook_failures: int = 0
    hook_seconds: float = 0.0
    tools: dict[str, _Tool] = field(default_factory=dict)
    turn_metrics: list[pb.TurnMetrics] = field(default_factory=list)

    def model_call(self, turn: int, usage: pb.Usage | None, seconds: float, *, by_hook: bool = False) -> None:
        """One model call (or a hook's answer in its place) of turn `turn`."""
        if not by_hook:
            self.model_calls += 1
            self.model_seconds += seconds
        metrics = pb.TurnMetrics(turn=turn, answered_by_hook=by_hook)
        if usage is not None:
            metrics.usage.CopyFrom(usage)
        metrics.model_time.FromNanoseconds(int(seconds * 1e9))
        self.turn_metrics.append(metrics)

    def tool_call(self, name: str, seconds: float, *, is_error: bool, timed_out: bool = False) -> None:
        tool = self.tools.setdefault(name, _Tool())
        tool.calls += 1
        tool.errors += is_error
        tool.timeouts += timed_out
        tool.seconds += seconds
        tool.longest = max(tool.longest, seconds)
        self.tool_seconds += seconds

    def hooks(self, calls: int, failures: int, seconds: float) -> None:
        """The hook totals so far (the hooks' own run keeps the running sums)."""
        self.hook_calls, self.hook_failures, self.hook_seconds = calls, failures, seconds

    @property
    def tool_calls(self) -> int:
        return sum(t.calls for t in self.tools.values())

    def write(self, metrics: pb.RunMetrics) -> None:
        """Into `metrics`, replacing what it held."""
        metrics.Clear()
        metrics.turns = self.turns
        metrics.model_calls = self.model_calls
        metrics.tool_calls = self.tool_calls
        metrics.tool_errors = sum(t.errors for t in self.tools.values())
        metrics.tool_timeouts = sum(t.timeouts for t in self.tools.values())
        metrics.model_time.FromNanoseconds(_ns(self.model_seconds))
        metrics.tool_time.FromNanoseconds(_ns(self.tool_seconds))
        metrics.hook_time.FromNanoseconds(_ns(self.hook_seconds))
        metrics.hook_calls = self.hook_calls
        metrics.hook_failures = self.hook_failures
        metrics.duration.FromNanoseconds(_ns(time.perf_counter() - self.started))
        for name, tool in self.tools.items():
            entry = metrics.tools.add(name=name, calls=tool.calls, errors=tool.errors, timeouts=tool.timeouts)
            entry.time.FromNanoseconds(_ns(tool.seconds))
            entry.max_time.FromNanoseconds(_ns(tool.longest))
        metrics.turn_metrics.extend(self.turn_metrics)


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)
