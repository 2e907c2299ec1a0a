"""One response from start to end. The run owns its state: nothing outside writes its fields or
its inbox (tests/test_structure.py checks it).

Its verbs are few: `append` (the one way the conversation grows); the waits — `receive`,
`wait_for_control`, `wait_for` (a hook call, a save) and the reads of a model call — each of which
reads a channel the inbox's bell rings on; `finish` (the one way it ends, through the status state
machine); what the run takes from its inbox where it acts (`take_steer`, `take_follow_up`,
`await_approvals` and `take_decisions`, `hold_paused`); and the controls — `send`, `stop`,
`detach` — which only record what came and ring the bell of the wait the run is in (inbox.py). No
control cancels a task: a task is cancelled only by its owner, or by asyncio itself when the client
goes away or the server shuts down.

`Engine.start` builds a Run; `events()` drives it (the loop in loop.py), and controls act on it
while it runs, from any task:
- stop (cancel, deadline, max duration): ends the wait the run is in (a hook call or a save is
  cancelled), else seen at its next check;
- steer: at once while the model answers (the call is cut); during tools and approvals when the
  round ends; otherwise at the next turn boundary;
- follow_up: when the model gives its final answer; pause: at the next check point;
- approval: ends the wait for decisions.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from antwort_grpc import pb
from antwort_grpc.engine import response_status
from antwort_grpc.engine.budget import ControlLimits, RunLimits
from antwort_grpc.engine.channel import RING, Channel
from antwort_grpc.engine.emitter import ResponseEmitter
from antwort_grpc.engine.hook_gate import NO_HOOKS, HookPoints
from antwort_grpc.engine.inbox import Inbox
from antwort_grpc.engine.model_task import ModelCall
from antwort_grpc.engine.outcomes import Cancelled, Failed, FinalOutcome, Incomplete
from antwort_grpc.engine.run_metrics import RunRecorder
from antwort_grpc.engine.tools import ToolSet
from antwort_grpc.engine.window import ContextWindow

T = TypeVar("T")


class Stopped(Exception):
    """A stop (cancel, deadline, max duration) seen by the run: it ends with the stop's outcome."""


@dataclass(slots=True)
class Continuation:
    """What a continued response starts with, before its first model turn."""

    # Server-side calls an earlier response made that may run now (answered by nobody yet).
    calls: list[pb.FunctionCall] = field(default_factory=list)
    # Outputs to add first: denials decided in the request's approval_response items.
    outputs: list[pb.FunctionCallOutput] = field(default_factory=list)
    # Client-executed calls approved just now: handed to the client at once.
    handoff: list[pb.FunctionCall] = field(default_factory=list)
    # Server-side calls approved just now: they pass the same gates as any call before they run.
    approved: set[str] = field(default_factory=set)

    @property
    def starts_with_tools(self) -> bool:
        return bool(self.calls or self.outputs or self.handoff)


@dataclass(slots=True)
class RunSetup:
    """What a run is made of, besides its request and response."""

    input_items: list[pb.Item]
    context: list[pb.Item]
    tools: ToolSet
    owner: str
    limits: RunLimits
    window: ContextWindow
    # The hook gate: a no-op one when no hook is configured.
    hooks: HookPoints = NO_HOOKS
    # What controls may add (their items and queues; the response's bytes in all).
    controls: ControlLimits = field(default_factory=ControlLimits)
    continuation: Continuation = field(default_factory=Continuation)
    controller: bool = False
    # The event the response was built in (its `completed`), and its echoed tools serialized:
    # what the emitter makes its lifecycle events of without copying the Response.
    ending: pb.StreamEvent | None = None
    echoed_tools: bytes | None = None


class Durable(Protocol):
    """What keeps a background run resumable (responses/background.py): set on its Run."""

    async def save(self, run: Run) -> None:
        """Checkpoint the run at a turn boundary (its events so far are in the log first)."""
        ...


class Run:
    # Whether its input and output join `request.conversation_id` when it ends (a compaction only
    # reads the conversation: keep_out_of_conversation). A class default: no cost per response.
    joins_conversation = True

    def __init__(self, request: pb.CreateResponseRequest, response: pb.Response, setup: RunSetup) -> None:
        self.request = request
        # The Response being built (the emitter fills it in; read it, never replace it).
        self.response = response
        self.emitter = ResponseEmitter(response, setup.ending, setup.echoed_tools)
        self.input_items = setup.input_items
        self.tools = setup.tools
        # Who started it: only they may read or control it.
        self.owner = setup.owner
        self.limits = setup.limits
        self.window = setup.window
        # Where the loop asks hooks; every hook call it makes from the run's task races the inbox.
        self.hooks = setup.hooks
        self.continuation = setup.continuation
        self.record = RunRecorder()
        self.done = asyncio.Event()
        self._inbox = Inbox(setup.controller, setup.controls, self._held_bytes)
        self._input_bytes = -1
        # Everything the model sees, in order: history, input, and what this response added.
        self._context = setup.context
        self._turn = 0
        self._round = 0
        self._outcome: FinalOutcome | None = None
        # The first turn's model call, started before `created` is written.
        self._early: ModelCall | None = None
        # Calls superseded since the last injection (reported with it).
        self._superseded: list[str] = []
        # The request's deadline in loop time (remote executors pass what remains of it on).
        self.deadline: float | None = None
        self._timers: list[asyncio.TimerHandle] = []
        self._events: Callable[[Run], AsyncGenerator[pb.StreamEvent, None]] | None = None
        # Read by anyone, written only by the run's verbs (time_limit, make_durable, restore,
        # abandon): plain attributes, as they are read on every response.
        # A background run's checkpoints (None: the connection owns the run, nothing is kept).
        self.durable: Durable | None = None
        # A resumed run: the events it starts with instead of created and in_progress.
        self.recovery: list[pb.StreamEvent] | None = None
        # Handed to another replica (or its lease lost): it ends without a final status here.
        self.abandoned = False
        self.hooks.bind(response, self.wait_for)

    # -- what anyone may read ----------------------------------------------------------------------

    @property
    def response_id(self) -> str:
        return self.response.id

    @property
    def context(self) -> Sequence[pb.Item]:
        return self._context

    @property
    def turn(self) -> int:
        return self._turn

    @property
    def round(self) -> int:
        return self._round

    @property
    def outcome(self) -> FinalOutcome | None:
        return self._outcome

    @property
    def stop_reason(self) -> str:
        return self._inbox.stop_reason

    @property
    def controller(self) -> bool:
        return self._inbox.controller

    @property
    def attention(self) -> bool:
        """A stop or a steering message came that the run has not acted on (read per delta)."""
        return self._inbox.attention

    @property
    def needs_checkpoint(self) -> bool:
        """Whether a check point has anything to do (a stop, a pause or steering messages came)."""
        inbox = self._inbox
        return inbox.attention or inbox.pause_reason is not None

    @property
    def steered(self) -> bool:
        """Steering messages wait to join the conversation."""
        return bool(self._inbox.steers)

    @property
    def follow_up_waiting(self) -> bool:
        return bool(self._inbox.follow_ups)

    @property
    def pause_reason(self) -> str | None:
        """Why the run is asked to pause (None: it is not)."""
        return self._inbox.pause_reason

    @property
    def paused(self) -> bool:
        return self._inbox.paused

    @property
    def decisions(self) -> Mapping[str, pb.ApprovalResponse]:
        """The decisions that came for the calls awaiting approval."""
        return self._inbox.decisions

    # -- the driver --------------------------------------------------------------------------------

    def bind(self, driver: Callable[[Run], AsyncGenerator[pb.StreamEvent, None]]) -> None:
        self._events = driver

    def events(self) -> AsyncGenerator[pb.StreamEvent, None]:
        """Every event of the response; iterate it once. Failures after the first event end the
        stream in-band with a terminal event."""
        assert self._events is not None, "a Run is made by Engine.start"
        events, self._events = self._events, None
        return events(self)

    def take_wire(self, event: pb.StreamEvent) -> bytes | None:
        """`event` serialized, when the engine kept its bytes (a lifecycle event: the Response
        serialized once, not once more by the writer); once per event."""
        return self.emitter.take_wire(event)

    def make_durable(self, durable: Durable) -> None:
        """A background run: checkpointed through `durable` (responses/background.py)."""
        self.durable = durable

    def time_limit(self, timeout: float) -> None:
        """The request's deadline, `timeout` seconds from now: the run stops a little early, so
        that its failed event still reaches the client in time."""
        self.deadline = asyncio.get_running_loop().time() + timeout
        self.stop_at(self.deadline - min(0.5, timeout * 0.1), "deadline")

    # -- controls (any task) -----------------------------------------------------------------------

    def send(self, control: pb.Control) -> None:
        """Act on the run; RequestError (and no effect) when the control does not fit its state."""
        self._inbox.send(control, self.response_id, self.done.is_set())

    def stop(self, reason: str = "cancelled") -> None:
        self._inbox.stop(reason)

    def detach(self) -> None:
        self._inbox.detach()

    def stop_at(self, when: float, reason: str) -> None:
        """Stop with `reason` at `when` (loop time)."""
        self._timers.append(asyncio.get_running_loop().call_at(when, self.stop, reason))

    def acknowledge(self) -> pb.ControlAccepted:
        """What a control that was accepted is answered with: the response's id, its status, and
        the sequence number of its last event (the control acts after it)."""
        return pb.ControlAccepted(
            response_id=self.response_id,
            status=self.response.status,
            sequence_number=self.emitter.sequence_number,
        )

    # -- the run's own verbs -----------------------------------------------------------------------

    def append(self, items: Sequence[pb.Item]) -> None:
        """Items the conversation gains (the model's output, tool outputs, injected input)."""
        self._context += items

    def restore(self, turn: int, round_: int, recovery: list[pb.StreamEvent] | None) -> None:
        """A resumed run goes on counting from its checkpoint, and starts with `recovery` (None:
        as any response does)."""
        self._turn, self._round = turn, round_
        self.record.turns = turn
        self.recovery = recovery

    def keep_out_of_conversation(self) -> None:
        """Read the conversation the request names as history, but add nothing to it."""
        self.joins_conversation = False

    def abandon(self) -> None:
        """Stop here without ending: another replica resumes the run from its checkpoint."""
        self.abandoned = True

    def next_turn(self) -> int:
        self._turn += 1
        self.record.turns = self._turn
        return self._turn

    def next_round(self) -> int:
        self._round += 1
        return self._round

    def check(self) -> None:
        """A check point: a stop that came ends the run here."""
        if self._inbox.stop_reason:
            raise Stopped

    def start_early(self, call: ModelCall) -> None:
        self._early = call

    def take_early(self) -> ModelCall | None:
        call, self._early = self._early, None
        return call

    def supersede(self, call_ids: Sequence[str]) -> None:
        """Calls that will not run (a steering message came): no decision is awaited for them."""
        self._superseded += call_ids
        self._inbox.take_decisions()

    def take_superseded(self) -> list[str]:
        taken, self._superseded = self._superseded, []
        return taken

    def take_steer(self) -> list[pb.Item]:
        """The steering messages that came, to join the conversation now."""
        return self._inbox.take_steer()

    def take_follow_up(self) -> list[pb.Item]:
        """The oldest follow-up, to start a new round with."""
        return self._inbox.take_follow_up()

    def pause(self, reason: str) -> None:
        """A pause asked for by a hook (a client's comes with `send`)."""
        self._inbox.pause_reason = reason

    # -- approvals -------------------------------------------------------------------------------

    def await_approvals(self, requests: Sequence[pb.ApprovalRequest]) -> None:
        """Calls that wait for a client's decision (with no client to decide: none do)."""
        self._inbox.await_approvals(requests if self._inbox.controller else ())

    def time_out_approvals(self) -> None:
        """The approval timeout passed: every call still undecided is denied ("timeout")."""
        decisions = self._inbox.decisions
        for call_id in self._inbox.awaiting:
            decisions.setdefault(call_id, pb.ApprovalResponse(call_id=call_id, reason="timeout"))

    def take_decisions(self) -> Mapping[str, pb.ApprovalResponse]:
        """The decisions that came; nothing awaits approval any more."""
        return self._inbox.take_decisions()

    # -- the waits: each reads a channel the inbox's bell rings on ---------------------------------

    def listen(self, channel: Channel | None) -> None:
        """The channel the run reads now (a model call's): the bell rings there (None: none)."""
        self._inbox.listen(channel)

    async def receive(self, channel: Channel) -> object:
        """The next thing on `channel` (tool results and progress), or RING when a control came
        first (the caller looks at the run)."""
        if len(channel):
            return channel.get_nowait()
        self._inbox.listen(channel)
        try:
            return await channel.get()
        finally:
            self._inbox.listen(None)

    async def wait_for_control(self, timeout_at: float | None = None) -> bool:
        """Wait until a control comes (False when `timeout_at`, in loop time, passes first)."""
        channel = Channel()
        self._inbox.listen(channel)
        # The timeout is a timer on the channel, not asyncio.timeout: that cancels the task, and a
        # task writing batched events may be in its write, not in this wait, when it expires.
        timer = None if timeout_at is None else asyncio.get_running_loop().call_at(timeout_at, channel.put_nowait, None)
        try:
            return await channel.get() is RING
        finally:
            if timer is not None:
                timer.cancel()
            self._inbox.listen(None)

    async def hold_paused(self) -> None:
        """Paused: wait here until a resume (a stop ends the run here)."""
        inbox = self._inbox
        inbox.paused = True
        while inbox.pause_reason is not None:
            await self.wait_for_control()
            self.check()
        inbox.paused = False

    async def wait_for(self, work: Awaitable[T]) -> T:
        """`work` (a hook call, a save) raced against the inbox: a stop that comes first cancels it
        and ends the run here (Stopped); any other control is left for the check point that reads
        it."""
        if self._inbox.stop_reason:
            if asyncio.iscoroutine(work):
                work.close()
            raise Stopped
        task = asyncio.ensure_future(work)
        channel = Channel()
        task.add_done_callback(channel.put_nowait)
        inbox = self._inbox
        inbox.listen(channel)
        rang = False
        try:
            while True:
                got = await channel.get()
                if got is task:
                    return task.result()  # type: ignore[no-any-return]
                if inbox.stop_reason:
                    raise Stopped
                rang = True
        finally:
            inbox.listen(None)
            if rang:
                inbox.ring()  # kept for the next wait: this one did not act on it
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def save_checkpoint(self) -> None:
        """A background run's checkpoint (its events so far are in its log first); nothing for a
        plain run."""
        if self.durable is not None:
            await self.wait_for(self.durable.save(self))

    # -- the end -----------------------------------------------------------------------------------

    def finish(self, outcome: FinalOutcome) -> None:
        """The run's end: the outcome applied to the response through the status state machine."""
        response_status.end(self.response, outcome)
        self._outcome = outcome
        self.stop_timers()

    @property
    def ended(self) -> bool:
        return self._outcome is not None

    def stop_timers(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers = []

    def close(self) -> None:
        """Nothing more will run: timers off, what is still queued dropped, `done` set."""
        self.stop_timers()
        self._inbox.clear()
        self.done.set()

    def stop_outcome(self) -> FinalOutcome:
        """The outcome of the stop that came."""
        reason = self._inbox.stop_reason
        if reason == "max_duration":
            return Incomplete("max_duration")
        if reason == "deadline":
            return Failed("deadline_exceeded", "the request's deadline passed before the response finished")
        return Cancelled()

    def _held_bytes(self) -> int:
        """What the response holds now, measured as a continuation reads it (input and output)."""
        if self._input_bytes < 0:
            self._input_bytes = sum(i.ByteSize() for i in self.input_items)
        return self._input_bytes + self.response.ByteSize()
