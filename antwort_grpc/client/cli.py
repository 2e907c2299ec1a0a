"""`antwort-grpc ask "…"` (one response) and `antwort-grpc chat` (a conversation), rendered as they
happen. Both run on the bidirectional `Converse` RPC, so approvals and steering work in both."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.json_format import ParseDict, ParseError

from antwort_grpc import pb
from antwort_grpc.client.connection import add_connection_flags, connection_from
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
    p.add_argument(
        "--approve-all", dest="approvals", action="store_const", const="all", help="approve every call that asks"
    )
    p.add_argument("--deny-all", dest="approvals", action="store_const", const="none", help="deny every call that asks")
    p.add_argument("--json", action="store_true", help="print the raw events, one JSON object per line")
    p.add_argument("--timeout", type=float, help="deadline of the whole session in seconds")
    p.add_argument("--previous", default="", help="continue after this response id (previous_response_id)")
    add_connection_flags(p)


def add_client_parsers(sub: Any) -> None:
    ask = sub.add_parser("ask", help="ask once and watch the run (text, reasoning, tools, approvals, usage)")
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
        "--idempotency-key", default="", metavar="KEY", help="a retry with the same key gets the same response"
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
    _request_flags(attach)
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
    return Options(
        model=args.model,
        instructions=args.instructions,
        tools=_tools(args.tools),
        tool_choice=_tool_choice(args.tool_choice),
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
        return await _ask_durable(args, connection, items)
    async with connection.channel() as channel:
        stub = pb.ResponsesServiceStub(channel)
        async with Session(
            stub, _options(args, connection.metadata), connection.target, unreachable=connection.unreachable
        ) as session:
            sessions.append(session)
            request = session.request(items, args.previous)
            if (text := _text_format(args.json_schema)) is not None:
                request.text.CopyFrom(text)
            response = await session.run(request)
            if not args.json and (hint := continuation_hint(session.last_event, args.tools)) is not None:
                session.prompts.print(hint, style="dim", highlight=False, soft_wrap=True)
    return exit_code(response)


async def _ask_durable(args: argparse.Namespace, connection: Any, items: list[pb.Item]) -> int:
    """`ask --background` (and `--idempotency-key`): a create that is not tied to this process;
    prints the response id (stdout) and how to follow it (stderr)."""
    request = pb.CreateResponseRequest(
        model=args.model,
        instructions=args.instructions,
        tools=_tools(args.tools),
        previous_response_id=args.previous,
        background=args.background,
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
        try:
            messages = [m async for m in stub.CreateResponse(request, metadata=metadata or None, timeout=args.timeout)]
        except grpc.aio.AioRpcError as error:
            raise StartupError(error_line(error, connection.unreachable)) from error
    event = messages[-1].event
    response = terminal_response(event) or getattr(event, event.WhichOneof("event") or "created").response
    print(response.id)
    if args.background:
        print(f"running in background: antwort-grpc attach {response.id}", file=sys.stderr)
        return 0
    return exit_code(response)


async def _attach_async(args: argparse.Namespace, sessions: list[Session]) -> int:
    connection = connection_from(args)
    async with connection.channel() as channel:
        stub = pb.ResponsesServiceStub(channel)
        async with Session(
            stub, _options(args, connection.metadata), connection.target, unreachable=connection.unreachable
        ) as session:
            sessions.append(session)
            response = await session.attach(args.response_id, args.after)
    return exit_code(response)


async def _chat_async(args: argparse.Namespace, sessions: list[Session]) -> int:
    connection = connection_from(args)
    async with connection.channel() as channel:
        stub = pb.ResponsesServiceStub(channel)
        async with Session(
            stub, _options(args, connection.metadata), connection.target, unreachable=connection.unreachable
        ) as session:
            sessions.append(session)
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
