"""`antwort-grpc ask "…"` (one response) and `antwort-grpc chat` (a conversation), rendered as they
happen. Both run on the bidirectional `Converse` RPC, so approvals and steering work in both."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.json_format import ParseDict, ParseError

from antwort_grpc import pb
from antwort_grpc.client.connection import Connection, add_connection_flags, connection_from
from antwort_grpc.client.render import HumanRenderer, terminal_response
from antwort_grpc.client.session import (
    Interrupted,
    Options,
    Session,
    chat,
    continuation_hint,
    error_line,
    exit_code,
    user_message,
)
from antwort_grpc.startup_errors import StartupError


def _request_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="", help="the model to ask for (default: the gateway's)")
    p.add_argument("--instructions", default="", help="system instructions")
    p.add_argument(
        "--tools",
        help="tools as the JSON of a list of antwort.v1.Tool (as grpcurl takes them), or @FILE holding it",
    )
    p.add_argument("--tool-choice", help="auto | required | none | the name of a function to force")
    p.add_argument("--previous", default="", help="continue after this response id (previous_response_id)")
    _session_flags(p)


def _session_flags(p: argparse.ArgumentParser) -> None:
    """What following a run takes, whoever started it: `attach` has these and no request's."""
    p.add_argument(
        "--approve-all", dest="approvals", action="store_const", const="all", help="approve every call that asks"
    )
    p.add_argument("--deny-all", dest="approvals", action="store_const", const="none", help="deny every call that asks")
    p.add_argument("--json", action="store_true", help="print the raw events, one JSON object per line")
    p.add_argument("--timeout", type=float, help="deadline of the whole session in seconds")
    add_connection_flags(p)


def add_client_parsers(sub: Any) -> None:
    ask = sub.add_parser(
        "ask",
        help="ask once and watch the run (text, reasoning, tools, approvals, usage); exit code 0 completed, "
        "1 failed or incomplete, 3 cancelled, 2 the call could not be made, 130 Ctrl-C (docs/cli.md)",
    )
    ask.add_argument("question", nargs="?", default="", help="the user message (optional with --output/--approve)")
    ask.add_argument(
        "--output", action="append", default=[], metavar="CALL_ID=RESULT", help="a function call's result, repeatable"
    )
    ask.add_argument("--approve", action="append", default=[], metavar="CALL_ID", help="approve a waiting call")
    ask.add_argument("--deny", action="append", default=[], metavar="CALL_ID", help="deny a waiting call")
    ask.add_argument(
        "--background",
        action="store_true",
        help="run it in background: print its id at once, follow it later with `attach ID`",
    )
    ask.add_argument(
        "--idempotency-key",
        default="",
        metavar="KEY",
        help="a retry with the same key shows the same response instead of starting another",
    )
    ask.add_argument(
        "--json-schema",
        metavar="FILE|JSON",
        help="structured output: the answer is JSON valid against this JSON Schema (a file, or the schema itself)",
    )
    _request_flags(ask)
    ask.set_defaults(run=_ask, approvals="ask")
    attach = sub.add_parser(
        "attach",
        help="follow a background response from where you left it (it may run on any replica); "
        "approvals and typed steering work as in ask",
    )
    attach.add_argument("response_id", help="the id `ask --background` printed")
    attach.add_argument("--after", type=int, default=0, metavar="N", help="the last sequence number you read")
    _session_flags(attach)
    attach.set_defaults(run=_attach, approvals="ask")
    talk = sub.add_parser(
        "chat",
        help="a conversation: type messages; while an answer runs, a typed line steers it "
        "(from a pipe: each line is the next message; /steer TEXT steers), /help lists the commands, "
        "approvals are y/n (docs/cli.md)",
    )
    _request_flags(talk)
    talk.set_defaults(run=_chat, approvals="ask")


def _tools(value: str | None) -> list[pb.Tool]:
    if not value:
        return []
    try:
        text = Path(value[1:]).read_text() if value.startswith("@") else value
        data = json.loads(text)
        if not isinstance(data, list):
            data = [data]
        return [ParseDict(tool, pb.Tool()) for tool in data]
    except (OSError, ValueError, ParseError) as error:
        raise StartupError(f"--tools: {error}") from error


def _tool_choice(value: str | None) -> pb.ToolChoice | None:
    if not value:
        return None
    modes = {
        "auto": pb.ToolChoiceMode.TOOL_CHOICE_MODE_AUTO,
        "required": pb.ToolChoiceMode.TOOL_CHOICE_MODE_REQUIRED,
        "none": pb.ToolChoiceMode.TOOL_CHOICE_MODE_NONE,
    }
    if value in modes:
        return pb.ToolChoice(mode=modes[value])
    return pb.ToolChoice(function=pb.NamedToolChoice(name=value))


def _text_format(value: str | None) -> pb.TextConfig | None:
    """--json-schema: a json_schema text format named after the schema's title or file."""
    if not value:
        return None
    try:
        inline = value.lstrip().startswith("{")
        schema = json.loads(value if inline else Path(value).read_text())
        if not isinstance(schema, dict):
            raise ValueError("a JSON Schema is an object")
        form = pb.JsonSchemaFormat(name=_format_name(schema.get("title"), "" if inline else Path(value).stem))
        form.schema.update(schema)
    except (OSError, ValueError) as error:
        raise StartupError(f"--json-schema: {error}") from error
    return pb.TextConfig(format=pb.TextFormat(json_schema=form))


def _format_name(*candidates: object) -> str:
    for name in candidates:
        if isinstance(name, str) and (cleaned := re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64]):
            return cleaned
    return "answer"


def _options(args: argparse.Namespace, metadata: tuple[tuple[str, str], ...]) -> Options:
    """The session's options; `attach` has no request flags (the request was made before)."""
    return Options(
        model=getattr(args, "model", ""),
        instructions=getattr(args, "instructions", ""),
        tools=_tools(getattr(args, "tools", None)),
        tool_choice=_tool_choice(getattr(args, "tool_choice", None)),
        approvals=args.approvals,
        json=args.json,
        timeout=args.timeout,
        metadata=metadata,
    )


def _ask_items(args: argparse.Namespace) -> list[pb.Item]:
    items: list[pb.Item] = []
    for output in args.output:
        call_id, sep, result = output.partition("=")
        if not sep or not call_id:
            raise StartupError(f"--output {output!r}: expected CALL_ID=RESULT")
        items.append(pb.Item(function_call_output=pb.FunctionCallOutput(call_id=call_id, output=result)))
    for call_id, approve in [(c, True) for c in args.approve] + [(c, False) for c in args.deny]:
        items.append(pb.Item(approval_response=pb.ApprovalResponse(call_id=call_id, approve=approve)))
    if args.question:
        items.append(user_message(args.question))
    if not items:
        raise StartupError("nothing to ask: give a question (or --output / --approve to continue a response)")
    return items


async def _ask_async(args: argparse.Namespace, sessions: list[Session]) -> int:
    connection = connection_from(args)
    items = _ask_items(args)
    if args.background or args.idempotency_key:
        return await _ask_durable(args, connection, items, sessions)
    async with _session(args, connection, sessions) as session:
        request = session.request(items, args.previous)
        if (text := _text_format(args.json_schema)) is not None:
            request.text.CopyFrom(text)
        response = await session.run(request)
        _hint(session, args.tools)
    return exit_code(response)


@contextlib.asynccontextmanager
async def _session(args: argparse.Namespace, connection: Connection, sessions: list[Session]) -> AsyncIterator[Session]:
    """A Converse session with the gateway, kept in `sessions` (Ctrl-C ends its renderer's line)."""
    async with connection.channel() as channel:
        stub = pb.ResponsesServiceStub(channel)
        async with Session(
            stub, _options(args, connection.metadata), connection.target, unreachable=connection.unreachable
        ) as session:
            sessions.append(session)
            yield session


def _hint(session: Session, tools: str | None) -> None:
    """The command that continues a response that waits for the client (not with --json)."""
    if not session.options.json and (hint := continuation_hint(session.last_event, tools)) is not None:
        session.prompts.print(hint, style="dim", highlight=False, soft_wrap=True)


async def _ask_durable(
    args: argparse.Namespace, connection: Connection, items: list[pb.Item], sessions: list[Session]
) -> int:
    """`ask --background` and `--idempotency-key`: a create that is not tied to a Converse
    stream. Background prints the response id (stdout) and how to follow it (stderr); a keyed
    create streams and prints as any `ask` (a retry's answer is the stored response, shown whole).
    Approvals cannot be answered on this stream: such a response ends `requires_action`, and
    the line printed last says how to continue it."""
    request = pb.CreateResponseRequest(
        model=args.model,
        instructions=args.instructions,
        tools=_tools(args.tools),
        previous_response_id=args.previous,
        background=args.background,
        stream=not args.background,
        batch_events=not args.background,
    )
    if (choice := _tool_choice(args.tool_choice)) is not None:
        request.tool_choice.CopyFrom(choice)
    if (text := _text_format(args.json_schema)) is not None:
        request.text.CopyFrom(text)
    request.input_items.items.extend(items)
    metadata = tuple(connection.metadata)
    if args.idempotency_key:
        metadata += (("idempotency-key", args.idempotency_key),)
    async with connection.channel() as channel:
        stub = pb.ResponsesServiceStub(channel)
        # Not entered: no Converse stream, only its renderer and what it prints.
        session = Session(stub, _options(args, connection.metadata), connection.target)
        sessions.append(session)
        if isinstance(session.renderer, HumanRenderer):
            session.renderer.restart_clock()
        try:
            async for message in stub.CreateResponse(request, metadata=metadata or None, timeout=args.timeout):
                for event in message.events or [message.event]:
                    if args.background:
                        response_id = _created_or_final(event).id
                        print(response_id)
                        print(f"running in background: antwort-grpc attach {response_id}", file=sys.stderr)
                        return 0
                    session.renderer.event(event)
                    if terminal_response(event) is not None:
                        session.last_event = event
        except grpc.aio.AioRpcError as error:
            raise StartupError(error_line(error, connection.unreachable)) from error
    if session.last_event is None:
        raise StartupError("the gateway closed the stream before the response ended")
    _hint(session, args.tools)
    return exit_code(terminal_response(session.last_event))


def _created_or_final(event: pb.StreamEvent) -> pb.Response:
    response = terminal_response(event) or getattr(event, event.WhichOneof("event") or "created").response
    assert isinstance(response, pb.Response)
    return response


async def _attach_async(args: argparse.Namespace, sessions: list[Session]) -> int:
    async with _session(args, connection_from(args), sessions) as session:
        response = await session.attach(args.response_id, args.after)
        _hint(session, None)  # its tools are the response's own
    return exit_code(response)


async def _chat_async(args: argparse.Namespace, sessions: list[Session]) -> int:
    async with _session(args, connection_from(args), sessions) as session:
        return await chat(session, args.previous)


def _interruptible(run: Any, args: argparse.Namespace) -> int:
    """Ctrl-C (a SIGINT, or the key at the terminal's input line) ends the client with one line
    and the shell's exit code for it, 130; leaving the stream cancels what ran on it."""
    sessions: list[Session] = []
    try:
        return int(asyncio.run(run(args, sessions)))
    except (KeyboardInterrupt, Interrupted):
        renderer = sessions[0].renderer if sessions else None
        if isinstance(renderer, HumanRenderer):
            renderer.end_line()  # the interrupted answer's line ends first
        print("interrupted", file=sys.stderr)
        return 130


def _ask(args: argparse.Namespace) -> int:
    return _interruptible(_ask_async, args)


def _attach(args: argparse.Namespace) -> int:
    return _interruptible(_attach_async, args)


def _chat(args: argparse.Namespace) -> int:
    return _interruptible(_chat_async, args)
