"""Runs on one `Converse` stream: `ask` runs one response, `chat` one after another.

Lines the person types while a response runs act on it: the answer to an approval prompt (y/n),
a `/command` (`/cancel`, `/pause [reason]`, `/resume`, `/follow TEXT`), or otherwise a steering
message. Lines come from any source (a terminal, a pipe), one at a time, so the client works the
same under a script as in a terminal.
"""

from __future__ import annotations

import asyncio
import collections
import sys
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import grpc
from grpc_status import rpc_status
from rich.console import Console
from rich.text import Text

from antwort_grpc import pb
from antwort_grpc.client.render import HumanRenderer, JsonRenderer, Renderer, terminal_response
from antwort_grpc.startup_errors import StartupError

ApprovalPolicy = Literal["ask", "all", "none"]
DENIED_BY_USER = "denied by the user"


class Lines:
    """Lines of stdin as an asyncio queue (None at end of input). A thread reads, because a
    terminal, a pipe and a file all block the same way there."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        threading.Thread(target=self._read, name="stdin", daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            self._loop.call_soon_threadsafe(self.queue.put_nowait, line.rstrip("\n"))
        self._loop.call_soon_threadsafe(self.queue.put_nowait, None)


def user_message(text: str) -> pb.Item:
    content = [pb.ContentPart(input_text=pb.InputText(text=text))]
    return pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=content))


def unreachable_line(target: str) -> Callable[[str], str]:
    def line(details: str) -> str:
        return f"cannot reach the gateway at {target} ({details}): start it, or set --target / ANTWORT_TARGET"

    return line


def error_line(error: grpc.aio.AioRpcError, unreachable: Callable[[str], str]) -> str:
    """An RPC error as one line, with the BadRequest field violations when there are any;
    `unreachable` says what a call that could not connect means."""
    code = error.code()
    if code == grpc.StatusCode.UNAVAILABLE and not _from_the_gateway(error):
        return unreachable(error.details() or "")
    line = f"{code.name}: {error.details()}"
    status = rpc_status.from_call(error)
    if status is not None:
        from google.rpc import error_details_pb2

        for detail in status.details:
            bad = error_details_pb2.BadRequest()
            if not detail.Unpack(bad):
                continue
            violations = "; ".join(f"{v.field}: {v.description}" for v in bad.field_violations)
            if violations not in line:
                line += f" ({violations})"
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
        self.lines: Lines | None = None
        self._line: asyncio.Future[str | None] | None = None
        self._call: Any = None
        self._pending = _Pending()
        self._eof = False
        self._outbox: asyncio.Queue[pb.ConverseRequest | None] = asyncio.Queue()
        self.last: pb.Response | None = None
        self.last_event: pb.StreamEvent | None = None

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
        if self._call is not None:
            self._call.cancel()

    async def _requests(self) -> AsyncIterator[pb.ConverseRequest]:
        while (message := await self._outbox.get()) is not None:
            yield message

    def listen(self) -> None:
        """Read typed lines (approvals, steering) from stdin while runs go on."""
        self.lines = Lines()

    async def next_line(self) -> str | None:
        if self.lines is None or self._eof:
            return None
        if self._line is None:
            self._line = asyncio.ensure_future(self.lines.queue.get())
        # Shielded: a caller that stops waiting (the run ended first) leaves the read pending,
        # and the next caller gets its line.
        line = await asyncio.shield(self._line)
        self._line = None
        self._eof = line is None
        return line

    def prompt(self, text: str) -> None:
        self.prompts.print(Text(text, style="bold"), end="")
        # Piped input is not echoed: what follows the prompt starts on a line of its own.
        if isinstance(self.renderer, HumanRenderer) and self.prompts is self.console and not sys.stdin.isatty():
            self.renderer.mid_line = True

    def request(self, items: list[pb.Item], previous: str = "") -> pb.CreateResponseRequest:
        o = self.options
        request = pb.CreateResponseRequest(
            model=o.model, instructions=o.instructions, tools=list(o.tools), previous_response_id=previous, stream=True
        )
        if o.tool_choice is not None:
            request.tool_choice.CopyFrom(o.tool_choice)
        request.input_items.items.extend(items)
        return request

    async def run(self, request: pb.CreateResponseRequest) -> pb.Response:
        """Start a response on the stream and follow it to its terminal event."""
        try:
            return await self._run(request)
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

    async def _run(self, request: pb.CreateResponseRequest) -> pb.Response:
        call = self._call
        if isinstance(self.renderer, HumanRenderer):
            self.renderer.restart_clock()
        self._outbox.put_nowait(pb.ConverseRequest(create=request))
        read: asyncio.Future[Any] | None = None
        while True:
            read = read or asyncio.ensure_future(call.read())
            waits: set[asyncio.Future[Any]] = {read}
            line = None
            if self.lines is not None and not self._eof:
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
                continue
            event = message.event
            self.renderer.event(event)
            if event.WhichOneof("event") == "approval_requested":
                await self._approvals(event.approval_requested.requests)
            if (response := terminal_response(event)) is not None:
                self.last, self.last_event = response, event
                self._pending.approvals.clear()
                return response

    async def _control(self, control: pb.Control) -> None:
        self._outbox.put_nowait(pb.ConverseRequest(control=control))

    async def _approvals(self, requests: Sequence[pb.ApprovalRequest]) -> None:
        policy = self.options.approvals
        if policy != "ask":
            for request in requests:
                await self._decide(request, policy == "all")
            return
        if self.lines is None:
            self.listen()
        self._pending.approvals.extend(requests)
        self._ask_next()

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
        if self._pending.approvals:
            answer = text.lower()
            if answer in ("y", "yes", "n", "no"):
                await self._decide(self._pending.approvals.popleft(), answer.startswith("y"))
            self._ask_next()
            return
        if not text:
            return
        command, _, rest = text.partition(" ")
        if command == "/cancel":
            await self._control(pb.Control(cancel=pb.CancelControl()))
        elif command == "/pause":
            await self._control(pb.Control(pause=pb.PauseControl(reason=rest)))
        elif command == "/resume":
            await self._control(pb.Control(resume=pb.ResumeControl()))
        elif command == "/follow" and rest:
            await self._control(pb.Control(follow_up=pb.FollowUpControl(items=[user_message(rest)])))
        else:
            await self._control(pb.Control(steer=pb.SteerControl(items=[user_message(text)])))


def exit_code(response: pb.Response | None) -> int:
    return 1 if response is None or response.status == pb.ResponseStatus.RESPONSE_STATUS_FAILED else 0


def continuation_hint(event: pb.StreamEvent | None) -> str | None:
    """How to continue a response that waits for the client, as a command line."""
    if event is None or event.WhichOneof("event") != "requires_action":
        return None
    action = event.requires_action
    parts = [f"antwort-grpc ask --previous {action.response.id}"]
    parts += [f"--output {call.call_id}='RESULT'" for call in action.tool_calls]
    parts += [f"--approve {request.call_id}" for request in action.approval_requests]
    return "continue with: " + " ".join(parts)


async def chat(session: Session, first_previous: str = "") -> int:
    """Prompt, run, repeat, until end of input or /quit."""
    previous = first_previous
    session.listen()
    while True:
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
            if line is None or line.strip() == "/quit":
                return exit_code(session.last) if session.last is not None else 0
            if not line.strip():
                continue
            items.append(user_message(line))
        response = await session.run(session.request(items, previous))
        previous = response.id
