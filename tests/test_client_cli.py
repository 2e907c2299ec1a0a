"""`antwort-grpc ask` and `antwort-grpc chat` as real processes against a real gateway whose fake
OpenAI-compatible backend (strict mode) streams, reasons and calls tools."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from antwort_grpc.config import GatewaySettings
from antwort_grpc.executors.base import FunctionExecutor, ToolExecutor
from antwort_grpc.gateway import start_gateway
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.providers.scripted import ScriptedProvider, Text
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply, ScriptedToolCall
from tests.auth_fixtures import api_keys
from tests.certs import authority
from tests.fakes import MockExecutor, echo
from tests.harness import GatewayClient, running_gateway

ANTWORT = str(Path(sys.executable).parent / "antwort-grpc")
WEATHER = {
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
}
GUARDED = {**WEATHER, "require_approval": {"mode": "APPROVAL_MODE_ALWAYS"}}
# How long a CLI process may take to print what a test waits for: a guard against a hang, not a
# measurement (a CLI started on a host whose cores other processes hold took 37 s once). Under the
# suite's own per-test timeout (120 s), so that a hang fails here, with what the CLI printed.
GUARD = 90.0
PARIS = ScriptedToolCall(id="call_paris", name="get_weather", arguments='{"city": "Paris"}')


@asynccontextmanager
async def gateway(
    *replies: Reply, executors: Sequence[ToolExecutor] = ()
) -> AsyncIterator[tuple[GatewayClient, FakeOpenAI]]:
    async with FakeOpenAI(*replies, strict=True) as fake:
        provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model="fake-model"))
        try:
            async with running_gateway(
                provider=provider, executors=[FunctionExecutor(), *executors], store=MemoryStore(), model="fake-model"
            ) as gw:
                yield gw, fake
        finally:
            await provider.aclose()


class Cli:
    """The client as a process: what it printed so far, and what the test types into it."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.output = ""

    @classmethod
    async def start(cls, *args: str) -> Cli:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANTWORT_")}
        process = await asyncio.create_subprocess_exec(
            ANTWORT, *args, env={**env, "COLUMNS": "200"},
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        return cls(process)

    async def expect(self, pattern: str, timeout: float = GUARD) -> re.Match[str]:
        """Read until the output matches (the prompts end without a newline)."""
        assert self.process.stdout is not None
        async with asyncio.timeout(timeout):
            while (found := re.search(pattern, self.output)) is None:
                chunk = await self.process.stdout.read(4096)
                assert chunk, f"the client exited before {pattern!r}:\n{self.output}"
                self.output += chunk.decode()
        return found

    async def type(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")
        await self.process.stdin.drain()

    async def finish(self, timeout: float = GUARD) -> int:
        assert self.process.stdin is not None and self.process.stdout is not None
        if not self.process.stdin.is_closing():
            self.process.stdin.close()
        async with asyncio.timeout(timeout):
            self.output += (await self.process.stdout.read()).decode()
            return await self.process.wait()


async def ask(*args: str, stdin: str = "") -> tuple[int, str]:
    cli = await Cli.start("ask", *args)
    assert cli.process.stdin is not None
    cli.process.stdin.write(stdin.encode())
    code = await cli.finish()
    return code, cli.output


async def test_ask_streams_reasoning_and_text_then_status_usage_and_timing() -> None:
    async with gateway(Reply(reasoning="Short question.", text="Bonjour tout le monde !", prompt_tokens=9)) as (gw, _):
        code, out = await ask("-t", gw.target, "Say hello in French.")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == "Short question."
    assert lines[1] == "Bonjour tout le monde !"
    assert re.fullmatch(r"completed · resp_[0-9a-f]+ · fake-model · 9 in / \d+ out tokens · \d+\.\d s", lines[2]), lines


async def test_ask_json_prints_each_event_as_one_json_object_per_line() -> None:
    async with gateway(Reply(text="Hello there.")) as (gw, _):
        code, out = await ask("-t", gw.target, "--json", "Say hello.")
    assert code == 0, out
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["sequence_number"] for e in events] == list(range(1, len(events) + 1))
    assert "created" in events[0] and "completed" in events[-1]
    deltas = [e["output_text_delta"]["delta"] for e in events if "output_text_delta" in e]
    assert "".join(deltas) == "Hello there."


async def test_ask_stops_at_requires_action_and_the_hint_it_prints_continues_it_with_its_tools() -> None:
    async with gateway(Reply(tool_calls=[PARIS]), Reply(text="It is 21 °C in Paris.")) as (gw, fake):
        code, out = await ask("-t", gw.target, "--tools", json.dumps([WEATHER]), "Weather in Paris?")
        assert code == 0, out
        assert '→ get_weather {"city": "Paris"}' in out
        assert "waiting for your result of call_paris" in out
        hint = re.search(r"continue with: antwort-grpc ask (--previous resp_\w+ --tools .*)$", out, re.M)
        assert hint is not None and "--output call_paris='RESULT'" in hint[1], out
        # The hint as a shell reads it, with the result in place of RESULT.
        continuation = shlex.split(hint[1].replace("'RESULT'", """'{"temp": 21}'"""))
        code, out = await ask("-t", gw.target, *continuation)
    assert code == 0, out
    assert out.startswith("It is 21 °C in Paris.\ncompleted · ")
    assert fake.chat_requests[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_paris",
        "content": '{"temp": 21}',
    }


async def test_ask_shows_a_server_side_tool_running_its_progress_and_its_result() -> None:
    lookup = MockExecutor({"get_weather": echo}, progress_messages=["asking the weather service"])
    replies = (Reply(tool_calls=[PARIS]), Reply(text="Sunny."))
    async with gateway(*replies, executors=[lookup]) as (gw, _):
        code, out = await ask("-t", gw.target, "--tools", json.dumps([WEATHER]), "Weather in Paris?")
    assert code == 0, out
    lines = out.splitlines()
    start = lines.index('→ get_weather {"city": "Paris"}')
    assert lines[start + 1 : start + 4] == [
        "  running get_weather …",
        "  · asking the weather service",
        '  ← {"tool": "get_weather", "arguments": {"city": "Paris"}}',
    ], lines
    assert "Sunny." in lines and "── turn 2" in lines


async def test_ask_asks_for_an_approval_and_a_no_is_fed_back_to_the_model() -> None:
    async with gateway(Reply(tool_calls=[PARIS]), Reply(text="Understood, no weather.")) as (gw, fake):
        code, out = await ask("-t", gw.target, "--tools", json.dumps([GUARDED]), "Weather in Paris?", stdin="n\n")
    assert code == 0, out
    assert 'approve get_weather {"city": "Paris"}? [y/n] ' in out
    assert "denied by the user" in out and "Understood, no weather." in out
    assert "\ncompleted · " in out
    tool_message = fake.chat_requests[1]["messages"][-1]
    assert tool_message["role"] == "tool" and "denied by the user" in tool_message["content"]


async def test_ask_without_anyone_to_approve_ends_requires_action_and_says_how_to_continue() -> None:
    async with gateway(Reply(tool_calls=[PARIS])) as (gw, _):
        code, out = await ask("-t", gw.target, "--tools", json.dumps([GUARDED]), "Weather in Paris?")
    assert code == 0, out
    assert "waiting for a decision on call_paris" in out
    assert re.search(r"continue with: antwort-grpc ask --previous resp_\w+ --tools '.*' --approve call_paris", out), out


async def test_ask_with_approve_all_approves_and_hands_the_call_out() -> None:
    async with gateway(Reply(tool_calls=[PARIS])) as (gw, _):
        code, out = await ask("-t", gw.target, "--approve-all", "--tools", json.dumps([GUARDED]), "Weather?")
    assert code == 0, out
    assert "approve get_weather" not in out
    assert "waiting for your result of call_paris" in out


async def test_a_failed_response_prints_its_error_and_exits_1() -> None:
    async with gateway(Reply(status=400, error_message="bad things", error_code="invalid_request_error")) as (gw, _):
        code, out = await ask("-t", gw.target, "Hi")
    assert code == 1
    assert "failed · resp_" in out and "invalid_request" in out


async def test_bad_input_and_an_unreachable_gateway_are_one_line() -> None:
    async with gateway() as (gw, _):
        code, out = await ask("-t", gw.target, "--tools", '[{"function": {"name": "bad name!"}}]', "Hi")
    assert code == 2
    assert out.strip().count("\n") == 0 and "INVALID_ARGUMENT" in out and "tools[0].function.name" in out
    code, out = await ask("-t", "127.0.0.1:1", "Hi")
    assert code == 2 and out.strip().count("\n") == 0, out
    assert "cannot reach the gateway at 127.0.0.1:1" in out and "--target / ANTWORT_TARGET" in out


async def test_chat_from_a_pipe_steers_with_slash_steer_asks_for_approval_and_takes_a_tool_result() -> None:
    slow = Reply(text="Once upon a time " + "there was a long story " * 200, delay=0.02)
    async with gateway(
        slow, Reply(text="Short, as you asked."), Reply(tool_calls=[PARIS]), Reply(text="It is 21 °C in Paris.")
    ) as (gw, fake):
        chat = await Cli.start("chat", "-t", gw.target, "--tools", json.dumps([GUARDED]))
        await chat.expect(r"you> $")
        await chat.type("Tell me a long story.")
        await chat.expect("Once upon a time")
        await chat.type("/steer Make it short.")  # from a pipe, a plain line would wait for the answer's end
        await chat.expect(r"↳ steered: Make it short\.")
        await chat.expect(r"Short, as you asked\.\ncompleted · resp_\w+ · fake-model")
        await chat.expect(r"you> $")
        await chat.type("Weather in Paris?")
        await chat.expect(r'approve get_weather \{"city": "Paris"\}\? \[y/n\] $')
        await chat.type("y")
        await chat.expect(r'result of get_weather \{"city": "Paris"\}> $')
        await chat.type('{"temp": 21}')
        await chat.expect(r"It is 21 °C in Paris\.\ncompleted · ")
        await chat.expect(r"you> $")
        code = await chat.finish()
    assert code == 0, chat.output
    steered = fake.chat_requests[1]["messages"]
    assert steered[-1] == {"role": "user", "content": "Make it short."}
    assert steered[-2]["role"] == "assistant" and steered[-2]["content"].startswith("Once upon a time")
    last = fake.chat_requests[3]["messages"]
    assert last[-1] == {"role": "tool", "tool_call_id": "call_paris", "content": '{"temp": 21}'}


async def test_chat_slash_commands_cancel_the_running_answer() -> None:
    slow = Reply(text="A long answer " + "and more " * 400, delay=0.02)
    async with gateway(slow) as (gw, _):
        chat = await Cli.start("chat", "-t", gw.target)
        await chat.expect(r"you> $")
        await chat.type("Talk.")
        await chat.expect("A long answer")
        await chat.type("/cancel")
        await chat.expect(r"cancelled · resp_\w+")
        await chat.expect(r"you> $")
        code = await chat.finish()
    assert code == 3, chat.output  # chat exits with its last answer's code: cancelled


async def test_ask_reaches_a_tls_gateway_with_a_token_and_with_a_client_certificate(tmp_path: Path) -> None:
    ca = authority(tmp_path)
    server, client = ca.issue("gateway", server=True), ca.issue("client", server=False)
    credentials = api_keys(tmp_path)
    settings = GatewaySettings(
        listen="127.0.0.1:0", model="m", tls_cert=server.cert, tls_key=server.key, tls_client_ca=ca.pem.cert,
        **credentials.settings,
    )  # fmt: skip
    provider = ScriptedProvider([[Text("over TLS")]], repeat=True)
    gateway = await start_gateway(settings, provider=provider, store=MemoryStore(), executors=[FunctionExecutor()])
    tls = ["-t", gateway.target, "--tls", "--cacert", str(ca.pem.cert), "--cert", str(client.cert)]
    try:
        code, out = await ask(*tls, "--key", str(client.key), "--token", credentials.tokens["alice"], "hi")
        assert code == 0 and out.startswith("over TLS\ncompleted · "), out
        header = ["-H", f"Authorization: Bearer {credentials.tokens['bob']}"]
        code, out = await ask(*tls, "--key", str(client.key), *header, "hi")
        assert code == 0 and out.startswith("over TLS\n"), out
        code, out = await ask(*tls, "--key", str(client.key), "--token", "not-a-key", "hi")
        assert code == 2 and out.startswith("antwort-grpc ask: UNAUTHENTICATED"), out
        code, out = await ask("-t", gateway.target, "--token", credentials.tokens["alice"], "hi")  # plaintext
        assert code == 2 and "speaks TLS" in out, out
    finally:
        await gateway.stop(0)


async def test_piped_lines_each_run_as_the_next_message_after_the_answer_before_them() -> None:
    slow = Reply(text="A long first answer " + "and more " * 60, delay=0.01)
    async with gateway(slow, Reply(text="Second answer.")) as (gw, fake):
        chat = await Cli.start("chat", "-t", gw.target)
        await chat.type("first question")
        await chat.type("second question")  # in the pipe long before the first answer ends
        code = await chat.finish()
    assert code == 0, chat.output
    assert "steered" not in chat.output
    assert chat.output.count("completed · resp_") == 2, chat.output
    second = fake.chat_requests[1]["messages"]
    assert second[-1] == {"role": "user", "content": "second question"}
    assert second[-2]["role"] == "assistant" and second[-2]["content"].rstrip().endswith("and more")


async def test_help_and_unknown_commands_are_answered_here_and_never_sent_to_the_model() -> None:
    async with gateway(Reply(text="Hello.")) as (gw, fake):
        chat = await Cli.start("chat", "-t", gw.target)
        for line in ("/help", "/frobnicate now", "/pause", "/follow", "//etc is a path", "/quit"):
            await chat.type(line)
        code = await chat.finish()
    assert code == 0, chat.output
    assert "/steer TEXT" in chat.output and "/follow TEXT" in chat.output, "the help lists the commands"
    assert "unknown command /frobnicate: /help lists the commands" in chat.output
    assert "/pause acts on a running answer, and none is running" in chat.output
    assert "/follow acts on a running answer, and none is running" in chat.output
    assert len(fake.chat_requests) == 1, "only the message went to the model"
    assert fake.chat_requests[0]["messages"][-1] == {"role": "user", "content": "/etc is a path"}


async def test_a_follow_up_the_response_ends_before_and_a_follow_without_text_say_so() -> None:
    slow = Reply(text="A long answer " + "and more " * 100, delay=0.02, hold_at=3)
    async with gateway(slow) as (gw, fake):
        chat = await Cli.start("chat", "-t", gw.target)
        await chat.type("Talk.")
        await fake.wait_held()
        await chat.type("/follow")  # without its text
        await chat.expect("/follow needs the text to send: /follow TEXT")
        await chat.type("/follow and then?")  # queued for after the answer…
        await chat.type("/cancel")  # …which is cancelled instead
        fake.release()
        await chat.expect(r"cancelled · resp_\w+")
        await chat.expect(r"/follow did not take effect: the response ended \(cancelled\) first")
        code = await chat.finish()
    assert code == 3, chat.output
    assert len(fake.chat_requests) == 1


async def test_ctrl_c_in_ask_while_the_answer_streams_and_at_the_approval_prompt_is_one_line_and_exit_130() -> None:
    slow = Reply(text="A long answer " + "and more " * 400, delay=0.02)
    async with gateway(slow, Reply(tool_calls=[PARIS])) as (gw, _):
        streaming = await Cli.start("ask", "-t", gw.target, "Talk.")
        await streaming.expect("A long answer")
        streaming.process.send_signal(signal.SIGINT)
        assert await streaming.finish() == 130, streaming.output
        approving = await Cli.start("ask", "-t", gw.target, "--tools", json.dumps([GUARDED]), "Weather?")
        await approving.expect(r"\[y/n\] $")
        approving.process.send_signal(signal.SIGINT)
        assert await approving.finish() == 130, approving.output
    for cli in (streaming, approving):
        assert "Traceback" not in cli.output
        assert cli.output.endswith("\ninterrupted\n"), cli.output


async def test_ask_background_prints_the_id_and_attach_renders_the_rest_of_the_run() -> None:
    async with gateway(Reply(text="Bonjour from the background.", first_delay=0.5)) as (gw, fake):
        cli = await Cli.start("ask", "-t", gw.target, "--background", "Say hello in French.")
        code = await cli.process.wait()
        assert cli.process.stdout is not None
        out = (await cli.process.stdout.read()).decode()
        assert code == 0, out
        response_id = re.search(r"^(resp_\w+)$", out, re.MULTILINE)
        assert response_id is not None, out
        assert f"antwort-grpc attach {response_id[1]}" in out
        code, rendered = await ask_command("attach", "-t", gw.target, response_id[1])
        assert code == 0, rendered
        assert "Bonjour from the background." in rendered and "completed" in rendered
        assert len(fake.chat_requests) == 1


async def ask_command(*args: str) -> tuple[int, str]:
    cli = await Cli.start(*args)
    assert cli.process.stdin is not None
    cli.process.stdin.close()
    code = await cli.process.wait()
    assert cli.process.stdout is not None
    return code, (await cli.process.stdout.read()).decode()
