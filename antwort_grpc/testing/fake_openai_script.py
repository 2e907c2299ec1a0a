"""The script of the fake OpenAI-compatible backend: what it answers to each request, in order."""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ScriptedToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: str = "{}"
    # Default: "call_<n>" with n counted over the whole backend.
    id: str | None = None
    # The arguments arrive in this many fragments, as real backends stream them.
    fragments: int = 2


class Reply(BaseModel):
    """One answer of the fake backend. Fields combine: reasoning, then text, then tool calls."""

    model_config = ConfigDict(extra="forbid")

    # Text: a string is split into word-sized deltas; a list gives the deltas exactly.
    text: str | list[str] = ""
    reasoning: str | list[str] = ""
    refusal: str = ""
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    # Default: "tool_calls" when there are tool calls, else "stop".
    finish_reason: str | None = None
    prompt_tokens: int = 7
    # Default: the number of text/reasoning deltas plus tool-call fragments.
    completion_tokens: int | None = None
    # Usage details as OpenAI reports them (prompt_tokens_details, completion_tokens_details).
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None
    # Each text delta's log probability (-0.5 per token, the token itself, and one alternative),
    # when the request asks for them (`logprobs`).
    logprobs: bool = False
    # Errors: a status other than 200 answers with an OpenAI-style error body.
    status: int = 200
    error_message: str = ""
    error_code: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    # Timing: before the response headers, and between streamed events.
    first_delay: float = 0.0
    delay: float = 0.0
    # The first streamed event that waits `delay` (the role chunk is event 0).
    delay_from: int = 1
    # Hold the stream before this data event until the test calls `FakeOpenAI.release()`.
    hold_at: int | None = None
    # Faults: abort the connection after this many data events; send garbage as event n (any
    # value: a non-streamed answer is garbage as a whole).
    cut_after: int | None = None
    malformed_at: int | None = None
    # The stream's exact data payloads (chunk-format fixtures); "[DONE]" is not added.
    raw: list[str] | None = None
    # Send the role-only first chunk (vLLM, llama.cpp and OpenAI do).
    role_chunk: bool = True
    send_done: bool = True
    # Answer this many consecutive requests with this reply (e.g. 503 three times).
    times: int = 1


class Script(BaseModel):
    """The file format of `python -m antwort_grpc.testing.fake_openai --script FILE`."""

    model_config = ConfigDict(extra="forbid")

    replies: list[Reply] = Field(default_factory=list)
    # Start over when the replies are used up (benchmarks); else answer 500 "script exhausted".
    loop: bool = False
    # When set, other model names get a 404 model_not_found.
    models: list[str] | None = None
    # When set, requests without "Authorization: Bearer <api_key>" get a 401.
    api_key: str | None = None
    # Reject a history OpenAI rejects (tool calls not answered at once by tool messages) with its 400.
    strict: bool = False


_WORDS = re.compile(r"\S+\s*|\s+")


def split_words(text: str | list[str]) -> list[str]:
    if isinstance(text, list):
        return text
    return _WORDS.findall(text)


def split_fragments(arguments: str, fragments: int) -> list[str]:
    if fragments <= 1 or len(arguments) <= 1:
        return [arguments]
    size = -(-len(arguments) // fragments)
    return [arguments[i : i + size] for i in range(0, len(arguments), size)]


def arguments_problem(position: int, calls: list[dict[str, Any]]) -> str | None:
    for n, call in enumerate(calls):
        arguments = (call.get("function") or {}).get("arguments")
        try:
            json.loads(arguments if isinstance(arguments, str) else "")
        except (TypeError, ValueError):
            return f"Invalid 'messages[{position}].tool_calls[{n}].function.arguments': not valid JSON: {arguments!r}"
    return None


def history_problem(messages: list[dict[str, Any]]) -> str | None:
    """What OpenAI's Chat Completions API says about a history it rejects, or None when valid:
    every assistant message with tool_calls must be followed at once by one tool message per call,
    a tool message must answer a call of the assistant message before it, and a call's arguments
    are JSON (self-hosted backends parse them in their chat templates)."""
    waiting: list[str] = []
    for position, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in waiting:
                return (
                    f"Invalid parameter: messages[{position}]: messages with role 'tool' must be a response "
                    "to a preceeding message with 'tool_calls'."
                )
            waiting.remove(call_id)
            continue
        if waiting:
            return (
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(waiting)}"
            )
        if role == "assistant":
            waiting = [str(call.get("id")) for call in message.get("tool_calls") or []]
            if (problem := arguments_problem(position, message.get("tool_calls") or [])) is not None:
                return problem
    if waiting:
        return (
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
            f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(waiting)}"
        )
    return None
