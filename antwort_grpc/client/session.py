"""Runs on one `Converse` stream: `ask` runs one response, `chat` one after another.

Lines the person types while a response runs act on it: the answer to an approval prompt (y/n),
a `/command` (`/help` lists them; an unknown one is answered here, never sent), or otherwise a
steering message. At a terminal, typing happens on an input line of its own below the output
(prompt_toolkit), so what is typed never mixes with the answer streaming above it. From a pipe or
a file, each line is the next message, sent once the response before it has ended; an approval
prompt takes the next line as its answer, and `/steer TEXT` steers (docs/cli.md).
"""

from __future__ import annotations

import asyncio
import collections
import json
import shlex
import sys
import termios
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import grpc
from google.protobuf.json_format import MessageToDict
from grpc_status import rpc_status
from rich.console import Console
from rich.text import Text

from antwort_grpc import pb
from antwort_grpc.client.render import HumanRenderer, JsonRenderer, Renderer, terminal_response
from antwort_grpc.startup_errors import StartupError

ApprovalPolicy = Literal["ask", "all", "none"]
DENIED_BY_USER = "denied by the user"


class Interrupted(Exception):
    """Ctrl-C at the terminal's input line (the terminal is in raw mode there: no SIGINT)."""


_INTERRUPT = "\x03"


class Lines:
    """Lines of stdin as an asyncio queue (None at end of input). A thread reads, because a
    pipe and a file block the same way there."""

    interactive = False

    def __init__(self) -> None:
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        threading.Thread(target=self._read, name="stdin", daemon=True).start()

    def _read(self) -> None:
        try:
            for line in sys.stdin:
                self._loop.call_soon_threadsafe(self.queue.put_nowait, line.rstrip("\n"))
            self._loop.call_soon_threadsafe(self.queue.put_nowait, None)
        except RuntimeError:
            # The loop closed first (Ctrl-C ended the client while stdin was still open): no one
            # reads what comes after, and a traceback from this thread would follow "interrupted".
            return

    def set_prompt(self, text: str) -> None:
        pass

    def show_partial(self, text: Text) -> None:
        pass

    async def close(self) -> None:
        pass


class TerminalLines:
    """Lines typed at a terminal, on an input line of their own: prompt_toolkit draws it below
    everything printed (its patched stdout), so the answer streams above what is being typed."""

    interactive = True
    # While a response runs, a typed line steers it.
    WAITING = "steer> "

    def __init__(self) -> None:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.patch_stdout import patch_stdout

        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self.message = self.WAITING
        # The answer's line still being streamed: drawn above the input line until it is whole
        # (a partial line printed above would be redrawn over), so a slow model is seen typing.
        self.partial = ""
        self._closing = False
        self._session: PromptSession[str] = PromptSession()
        self._patch = patch_stdout(raw=True)
        self._patch.__enter__()
        self._task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        while not self._closing:
            try:
                line = await self._session.prompt_async(self._prompt)
            except EOFError:
                self.queue.put_nowait(None)
                return
            except KeyboardInterrupt:
                self.queue.put_nowait(_INTERRUPT)
                return
            self.message = self.WAITING
            self.queue.put_nowait(line)

    def _prompt(self) -> str:
        return f"{self.partial}\n{self.message}" if self.partial else self.message

    def set_prompt(self, text: str) -> None:
        self.message = text
        self._redraw()

    def show_partial(self, text: Text) -> None:
        self.partial = text.plain
        self._redraw()

    def _redraw(self) -> None:
        app = self._session.app
        if app.is_running:
            app.invalidate()

    async def close(self) -> None:
        """Take the input line away, then give stdout back: what is still to be written (the
        end of the answer, its status line) is written first."""
        self._closing = True
        app = self._session.app
        if app.is_running:
            self.message = self.partial = ""  # the input line's last drawing stays on the screen: an empty one
            app.exit(exception=EOFError())
        try:
            await asyncio.wait_for(asyncio.shield(self._task), 5)
        except (TimeoutError, asyncio.CancelledError):
            self._task.cancel()
        self._patch.__exit__(None, None, None)


HELP = """commands (while an answer runs, unless marked):
  /cancel          stop the running answer
  /pause [REASON]  pause it at its next check point; /resume goes on
  /steer TEXT      steer it with TEXT (at a terminal, any plain line steers)
  /follow TEXT     queue TEXT as a follow-up, answered after the current answer
  /help            this list
  /quit            end the chat (between answers; during one: after it)
  //TEXT           a message that starts with a slash
approval prompts take y or n."""
_RUN_COMMANDS = ("/cancel", "/pause", "/resume", "/steer", "/follow")


def user_message(text: str) -> pb.Item:
    content = [pb.ContentPart(input_text=pb.InputText(text=text))]
    return pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=content))


def unreachable_line(target: str) -> Callable[[str], str]:
    def line(details: str) -> str:
        return f"cannot reach the gateway at {target} ({details}): start it, or set --target / ANTWORT_TARGET"

    return line


def error_line(error: grpc.aio.AioRpcError, unreachable: Callable[[str], str]) -> str:
    """An RPC error as one line, with the BadRequest field violations when there are any (a
    violation the message already says is named by its field only); `unreachable` says what a
    call that could not connect means."""
    code = error.code()
    if code == grpc.StatusCode.UNAVAILABLE and not _from_the_gateway(error):
        return unreachable(error.details() or "")
    details = error.details() or ""
    line = f"{code.name}: {details}"
    status = rpc_status.from_call(error)
    if status is not None:
        from google.rpc import error_details_pb2

        for detail in status.details:
            bad = error_details_pb2.BadRequest()
            if not detail.Unpack(bad):
                continue
            said = [v.field for v in bad.field_violations if v.description in details and v.field not in details]
            unsaid = [f"{v.field}: {v.description}" for v in bad.field_violations if v.description not in details]
            if extra := "; ".join(said + unsaid):
                line += f" ({extra})"
    return line


def _from_the_gateway(error: grpc.aio.AioRpcError) -> bool:
    """Whether the gateway answered (its statuses carry google.rpc.Status details), rather than
    the connection failing."""
    try:
        return rpc_status.from_call(error) is not None
    except ValueError:
        return False


@dataclass
class Options:
    model: str = ""
    instructions: str = ""
    tools: Sequence[pb.Tool] = ()
    tool_choice: pb.ToolChoice | None = None
    approvals: ApprovalPolicy = "ask"
    json: bool = False
    timeout: float | None = None
    metadata: Sequence[tuple[str, str]] = ()


@dataclass
class _Pending:
    approvals: collections.deque[pb.ApprovalRequest] = field(default_factory=collections.deque)


class Session:
    """One Converse stream and what is typed into it."""

    def __init__(
        self,
        stub: Any,
        options: Options,
        target: str,
        console: Console | None = None,
        unreachable: Callable[[str], str] | None = None,
    ) -> None:
        self.stub = stub
        self.options = options
        self.target = target
        self.unreachable = unreachable or unreachable_line(target)
        self.console = console or Console(highlight=False)
        # Prompts go to stderr in --json mode, so stdout stays one JSON object per line.
        self.prompts = Console(stderr=True, highlight=False) if options.json else self.console
        self.renderer: Renderer = JsonRenderer(self.console) if options.json else HumanRenderer(self.console)
        self.lines: Lines | TerminalLines | None = None
        self._line: asyncio.Future[str | None] | None = None
        # From a pipe: a message read while a response ran, sent once it has ended.
        self._held: str | None = None
        # /pause and /follow sent during the running response, until they take effect.
        self._asked: set[str] = set()
        self.quit = False
        self._call: Any = None
        self._pending = _Pending()
        self._eof = False
        self._outbox: asyncio.Queue[pb.ConverseRequest | None] = asyncio.Queue()
        self.last: pb.Response | None = None
        self.last_event: pb.StreamEvent | None = None
        # Approval requests of the message being read, asked once all its events are read.
        self._requested: list[pb.ApprovalRequest] = []

    async def __aenter__(self) -> Session:
        # Messages go out through a queue read by a request iterator, so sending never waits on
        # the stream and a control typed mid-run cannot interleave with a create.
        self._call = self.stub.Converse(
            self._requests(), metadata=tuple(self.options.metadata) or None, timeout=self.options.timeout
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._line is not None:
            self._line.cancel()
        if self.lines is not None:
            await self.lines.close()
        if self._call is not None:
            self._call.cancel()

    async def _requests(self) -> AsyncIterator[pb.ConverseRequest]:
        while (message := await self._outbox.get()) is not None:
            yield message

    def listen(self, *, fresh: bool = False) -> None:
        """Read typed lines (approvals, steering) from stdin while runs go on. `fresh`: at a
        terminal, what was typed before is dropped (typed ahead while `ask` streamed, a "y" and
        Enter would otherwise approve a call before its prompt showed)."""
        at_terminal = sys.stdin.isatty() and sys.stdout.isatty() and not self.options.json
        if at_terminal and fresh:
            termios.tcflush(sys.stdin.fileno(), termios.TCIFLUSH)
        self.lines = TerminalLines() if at_terminal else Lines()
        if isinstance(self.lines, TerminalLines) and isinstance(self.renderer, HumanRenderer):
            self.renderer.end_line()
            self.renderer.buffered = True
            self.renderer.show_partial = self.lines.show_partial

    @property
    def interactive(self) -> bool:
        return self.lines is not None and self.lines.interactive

    async def next_line(self) -> str | None:
        if self._held is not None:
            held, self._held = self._held, None
            return held
        if self.lines is None or self._eof:
            return None
        if self._line is None:
            self._line = asyncio.ensure_future(self.lines.queue.get())
        # Shielded: a caller that stops waiting (the run ended first) leaves the read pending,
        # and the next caller gets its line.
        line = await asyncio.shield(self._line)
        self._line = None
        if line == _INTERRUPT:
            raise Interrupted
        self._eof = line is None
        return line

    def prompt(self, text: str) -> None:
        if self.lines is not None and self.lines.interactive:
            self.lines.set_prompt(text)
            return
        self.prompts.print(Text(text, style="bold"), end="")
        # Piped input is not echoed: what follows the prompt starts on a line of its own.
        if isinstance(self.renderer, HumanRenderer) and self.prompts is self.console and not sys.stdin.isatty():
            self.renderer.mid_line = True

    def request(self, items: list[pb.Item], previous: str = "") -> pb.CreateResponseRequest:
        o = self.options
        # Events the gateway produces together come in one message (fewer messages to read).
        request = pb.CreateResponseRequest(
            model=o.model,
            instructions=o.instructions,
            tools=list(o.tools),
            previous_response_id=previous,
            stream=True,
            batch_events=True,
        )
        if o.tool_choice is not None:
            request.tool_choice.CopyFrom(o.tool_choice)
        request.input_items.items.extend(items)
        return request

    async def run(self, request: pb.CreateResponseRequest) -> pb.Response:
        """Start a response on the stream and follow it to its terminal event."""
        return await self.follow(pb.ConverseRequest(create=request))

    async def attach(self, response_id: str, after: int = 0) -> pb.Response:
        """Follow a response already running (a background one) from after sequence number
        `after`; approvals and typed lines act on it as on one started here."""
        attach = pb.AttachResponseRequest(response_id=response_id, starting_after=after, batch_events=True)
        if isinstance(self.renderer, HumanRenderer):
            self.renderer.server_clock = True  # the run began before this client looked
        return await self.follow(pb.ConverseRequest(attach=attach))

    async def follow(self, first: pb.ConverseRequest) -> pb.Response:
        try:
            return await self._run(first)
        except grpc.aio.AioRpcError as error:
            raise StartupError(error_line(await self._final(error), self.unreachable)) from error

    async def _final(self, error: grpc.aio.AioRpcError) -> grpc.aio.AioRpcError:
        """The server's verdict when the stream broke before its status arrived: grpcio reports a
        local INTERNAL when the first message races the server's rejection of the call (bad
        credentials, say). A unary call with the same metadata then gets the real status."""
        if error.code() != grpc.StatusCode.INTERNAL or "from Core" not in (error.details() or ""):
            return error
        probe = pb.GetResponseRequest(response_id="resp_status_probe")
        try:
            await self.stub.GetResponse(probe, metadata=tuple(self.options.metadata) or None, timeout=10)
        except grpc.aio.AioRpcError as verdict:
            if verdict.code() in (
                grpc.StatusCode.UNAUTHENTICATED,
                grpc.StatusCode.PERMISSION_DENIED,
                grpc.StatusCode.UNAVAILABLE,
            ):
                return verdict
        return error

    async def _run(self, first: pb.ConverseRequest) -> pb.Response:
        call = self._call
        if isinstance(self.renderer, HumanRenderer):
            self.renderer.restart_clock()
        self._outbox.put_nowait(first)
        read: asyncio.Future[Any] | None = None
        while True:
            read = read or asyncio.ensure_future(call.read())
            waits: set[asyncio.Future[Any]] = {read}
            line = None
            # From a pipe, a message read during the run waits for its end: nothing after it is
            # read until then (an approval prompt takes it as its answer, if it is one).
            if self.lines is not None and not self._eof and self._held is None:
                line = asyncio.ensure_future(self.next_line())
                waits.add(line)
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if line is not None:
                if line in done:
                    await self._typed(line.result())
                else:
                    line.cancel()  # the shielded read of stdin goes on; nothing typed is lost
            if read not in done:
                continue
            message = read.result()
            read = None
            if message is grpc.aio.EOF:
                raise StartupError("the gateway closed the stream before the response ended")
            if message.WhichOneof("message") == "rejected":
                self.renderer.rejected(message.rejected)
                self._asked.clear()  # the rejection says why it will not happen
                continue
            for event in message.events or [message.event]:
                if (response := await self._read(event)) is not None:
                    return response
            if self._requested:
                requests, self._requested = self._requested, []
                await self._approvals(requests)

    async def _read(self, event: pb.StreamEvent) -> pb.Response | None:
        """One event of the response: shown, acted on; its Response when it is the terminal one.
        Approval requests are asked once the message's events are all read: an attach replays
        a log, and a request the events after it show decided is never asked again."""
        self.renderer.event(event)
        self._took_effect(event)
        if event.WhichOneof("event") == "approval_requested":
            self._requested.extend(event.approval_requested.requests)
        elif self._requested or self._pending.approvals:
            self._decided(event)
        if (response := terminal_response(event)) is not None:
            self.last, self.last_event = response, event
            self._pending.approvals.clear()
            self._unanswered(response)
        return response

    def _decided(self, event: pb.StreamEvent) -> None:
        """Drop the approval requests an event shows decided: the call runs, has its output, or
        was superseded; a new turn means every request before it was decided."""
        kind = event.WhichOneof("event")
        done: set[str] | None = None
        if kind == "turn_started":
            done = {r.call_id for r in self._requested} | {r.call_id for r in self._pending.approvals}
        elif kind == "tool_execution_in_progress":
            done = {event.tool_execution_in_progress.call_id}
        elif kind in ("output_item_added", "output_item_done"):
            item = getattr(event, kind).item
            if item.WhichOneof("kind") == "function_call_output":
                done = {item.function_call_output.call_id}
        elif kind == "input_injected":
            done = set(event.input_injected.superseded_call_ids)
        if not done:
            return
        self._requested = [r for r in self._requested if r.call_id not in done]
        prompted = self._pending.approvals[0].call_id if self._pending.approvals else None
        self._pending.approvals = collections.deque(r for r in self._pending.approvals if r.call_id not in done)
        if prompted in done:
            self.renderer.note("(decided already)")
            self._ask_next()

    def _took_effect(self, event: pb.StreamEvent) -> None:
        kind = event.WhichOneof("event")
        if kind == "paused":
            self._asked.discard("/pause")
        elif kind == "input_injected" and event.input_injected.kind == pb.InputKind.INPUT_KIND_FOLLOW_UP:
            self._asked.discard("/follow")

    def _unanswered(self, response: pb.Response) -> None:
        """A /pause or /follow the response ended before: said, not left to be wondered about."""
        status = pb.ResponseStatus.Name(response.status).removeprefix("RESPONSE_STATUS_").lower()
        for command in sorted(self._asked):
            self.renderer.note(f"{command} did not take effect: the response ended ({status}) first")
        self._asked.clear()

    async def _control(self, control: pb.Control) -> None:
        self._outbox.put_nowait(pb.ConverseRequest(control=control))

    async def _approvals(self, requests: Sequence[pb.ApprovalRequest]) -> None:
        policy = self.options.approvals
        if policy != "ask":
            for request in requests:
                await self._decide(request, policy == "all")
            return
        if self.lines is None:
            self.listen(fresh=True)
        self._pending.approvals.extend(requests)
        self._ask_next()
        if self._held is not None:  # read from a pipe before the prompt came: it answers it
            line, self._held = self._held, None
            await self._typed(line)

    def _ask_next(self) -> None:
        if self._pending.approvals:
            request = self._pending.approvals[0]
            self.prompt(f"approve {request.name} {request.arguments}? [y/n] ")

    async def _decide(self, request: pb.ApprovalRequest, approve: bool) -> None:
        decision = pb.ApprovalResponse(
            call_id=request.call_id, approve=approve, reason="" if approve else DENIED_BY_USER
        )
        await self._control(pb.Control(approval=decision))

    async def _typed(self, line: str | None) -> None:
        if line is None:
            # End of input: let go of the stream's sending side; calls still waiting for a
            # decision then end the response REQUIRES_ACTION, to be continued later.
            if self._pending.approvals:
                self._outbox.put_nowait(None)
            return
        text = line.strip()
        if is_command(text):
            await self._command(text)
            return
        if self._pending.approvals:
            answer = text.lower()
            if answer in ("y", "yes", "n", "no"):
                await self._decide(self._pending.approvals.popleft(), answer.startswith("y"))
            self._ask_next()
            return
        if not text:
            return
        if not self.interactive:
            self._held = line  # the next message, once this response has ended
            return
        await self._steer(unslashed(text))

    async def _steer(self, text: str) -> None:
        await self._control(pb.Control(steer=pb.SteerControl(items=[user_message(text)])))

    async def _command(self, text: str) -> None:
        command, _, rest = text.partition(" ")
        rest = rest.strip()
        if command == "/cancel":
            await self._control(pb.Control(cancel=pb.CancelControl()))
        elif command == "/pause":
            self._asked.add(command)
            await self._control(pb.Control(pause=pb.PauseControl(reason=rest)))
        elif command == "/resume":
            await self._control(pb.Control(resume=pb.ResumeControl()))
        elif command in ("/steer", "/follow") and not rest:
            self.renderer.note(f"{command} needs the text to send: {command} TEXT")
        elif command == "/steer":
            await self._steer(rest)
        elif command == "/follow":
            self._asked.add(command)
            await self._control(pb.Control(follow_up=pb.FollowUpControl(items=[user_message(rest)])))
            self.renderer.note(f"follow-up sent: {rest} (answered once this answer ends)")
        elif command == "/quit":
            self.quit = True
            self.renderer.note("the chat ends after this answer (/cancel stops it now)")
        else:
            self.local_command(command)
        self._ask_next()

    def local_command(self, command: str) -> None:
        """What is answered here, never sent: /help, a run's command with no run, an unknown one."""
        if command == "/help":
            self.renderer.note(HELP)
        elif command in _RUN_COMMANDS:
            self.renderer.note(f"{command} acts on a running answer, and none is running")
        else:
            self.renderer.note(f"unknown command {command}: /help lists the commands (//TEXT sends a message)")


def is_command(text: str) -> bool:
    return text.startswith("/") and not text.startswith("//")


def unslashed(text: str) -> str:
    """`//TEXT` is the message `/TEXT`."""
    return text[1:] if text.startswith("//") else text


# The exit code per final status (docs/cli.md): 2 is taken by "the call could not be made", 130
# by Ctrl-C; a response that waits for the client (requires_action) ended as it should.
EXIT_CODES = {
    pb.ResponseStatus.RESPONSE_STATUS_COMPLETED: 0,
    pb.ResponseStatus.RESPONSE_STATUS_REQUIRES_ACTION: 0,
    pb.ResponseStatus.RESPONSE_STATUS_CANCELLED: 3,
}


def exit_code(response: pb.Response | None) -> int:
    """0 completed (or waiting for the client), 3 cancelled, 1 failed, incomplete or none."""
    return 1 if response is None else EXIT_CODES.get(response.status, 1)


def continuation_hint(event: pb.StreamEvent | None, tools: str | None = None) -> str | None:
    """How to continue a response that waits for the client, as a command line. `tools`: the
    --tools value the response was asked with (a continuation runs its calls with them); None:
    the response's own tools (an attached response was asked for by another command)."""
    if event is None or event.WhichOneof("event") != "requires_action":
        return None
    action = event.requires_action
    if tools is None and action.response.tools:
        tools = json.dumps(
            [MessageToDict(tool, preserving_proto_field_name=True) for tool in action.response.tools],
            ensure_ascii=False,
        )
    parts = [f"antwort-grpc ask --previous {action.response.id}"]
    if tools:
        parts.append(f"--tools {shlex.quote(tools)}")
    parts += [f"--output {call.call_id}='RESULT'" for call in action.tool_calls]
    parts += [f"--approve {request.call_id}" for request in action.approval_requests]
    return "continue with: " + " ".join(parts)


async def chat(session: Session, first_previous: str = "") -> int:
    """Prompt, run, repeat, until end of input or /quit."""
    previous = first_previous
    session.listen()
    while not session.quit:
        items: list[pb.Item] = []
        event = session.last_event
        if event is not None and event.WhichOneof("event") == "requires_action":
            for call in event.requires_action.tool_calls:
                session.prompt(f"result of {call.name} {call.arguments}> ")
                line = await session.next_line()
                if line is None:
                    return exit_code(session.last)
                items.append(pb.Item(function_call_output=pb.FunctionCallOutput(call_id=call.call_id, output=line)))
        else:
            session.prompt("you> ")
            line = await session.next_line()
            text = (line or "").strip()
            if line is None or text == "/quit":
                break
            if is_command(text):
                session.local_command(text.partition(" ")[0])
                continue
            if not text:
                continue
            items.append(user_message(unslashed(text)))
        response = await session.run(session.request(items, previous))
        previous = response.id
    return exit_code(session.last) if session.last is not None else 0
