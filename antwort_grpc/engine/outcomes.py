"""Where one turn of the loop leads: the loop is a `match` over these."""

from __future__ import annotations

from dataclasses import dataclass, field

from antwort_grpc import pb


@dataclass(frozen=True, slots=True)
class Completed:
    """A final answer (or tool calls that are not to be executed): the response completes."""


@dataclass(frozen=True, slots=True)
class ExecuteTools:
    """Run these calls on server-side executors, feed the results back, run another turn."""

    calls: list[pb.FunctionCall]
    rejected: list[pb.FunctionCallOutput] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RequiresAction:
    """The client must execute these calls (or decide these approvals); the response pauses."""

    calls: list[pb.FunctionCall]
    rejected: list[pb.FunctionCallOutput] = field(default_factory=list)
    approvals: list[pb.ApprovalRequest] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Incomplete:
    reason: str


@dataclass(frozen=True, slots=True)
class Failed:
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Cancelled:
    pass


@dataclass(frozen=True, slots=True)
class RunAgain:
    """Another turn: tool results, or a steering message, are for the model to see."""


@dataclass(frozen=True, slots=True)
class NextRound:
    """The model answered and a follow-up waits: it joins the conversation, another turn runs."""


FinalOutcome = Completed | RequiresAction | Incomplete | Failed | Cancelled
# Where one turn of the loop leads.
TurnOutcome = RunAgain | NextRound | FinalOutcome
