"""`antwort-grpc ask` and `chat` in a real terminal: tmux runs the client in a pane, the test types
with send-keys and reads the screen with capture-pane, polling until what it expects is there (a
generous deadline, no timing asserts). The gateway is real, its fake backend scripted."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from antwort_grpc.testing.fake_openai import Reply
from tests.test_client_cli import ANTWORT, GUARDED, PARIS, gateway


@pytest.fixture(autouse=True)
def _tmux() -> None:
    # Not a skip: a terminal test that does not run proves nothing (make test installs tmux).
    if shutil.which("tmux") is None:
        pytest.fail("tmux is missing: scripts/system-deps.sh installs it (make test runs it)")


SLOW_STORY = Reply(text="Once upon a time " + "there was a long story " * 300, delay=0.03)


class Pane:
    """One tmux server of its own (its own socket), one pane running the client."""

    def __init__(self, socket: str) -> None:
        self.socket = socket

    async def tmux(self, *args: str, output: bool = True) -> str:
        # Without output, no pipe: the tmux server that `new-session` starts would inherit it, and
        # uvloop (unlike the standard loop) waits for every holder of the pipe to close it.
        pipe = asyncio.subprocess.PIPE if output else asyncio.subprocess.DEVNULL
        process = await asyncio.create_subprocess_exec(
            "tmux", "-L", self.socket, *args, stdout=pipe, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await process.communicate()
        assert process.returncode == 0, out.decode()
        return out.decode() if out else ""

    async def keys(self, *keys: str) -> None:
        await self.tmux("send-keys", "-t", "client", *keys)

    async def screen(self) -> str:
        """What the pane shows (and its scrollback); tmux drops the spaces that end a line."""
        return await self.tmux("capture-pane", "-p", "-t", "client", "-S", "-200")

    async def expect(self, pattern: str, timeout: float = 60) -> str:
        """The screen once `pattern` (a multi-line regex) is on it."""
        screen = ""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    screen = await self.screen()
                    if re.search(pattern, screen, re.M):
                        return screen
                    await asyncio.sleep(0.1)
        except TimeoutError:
            raise AssertionError(f"{pattern!r} never showed; the screen:\n{screen}") from None


@asynccontextmanager
async def terminal(*args: str) -> AsyncIterator[Pane]:
    """The client in a 100x40 terminal; after it exits the pane shows EXIT=<its exit code>."""
    pane = Pane(f"antwort-test-{uuid.uuid4().hex[:12]}")
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "TERM": "xterm-256color"}
    command = " ".join(
        shlex.quote(part) for part in ["env", "-i", *(f"{k}={v}" for k, v in env.items()), ANTWORT, *args]
    )
    await pane.tmux(
        "new-session",
        "-d",
        "-s",
        "client",
        "-x",
        "100",
        "-y",
        "40",
        f"{command}; echo EXIT=$?; sleep 600",
        output=False,
    )
    try:
        yield pane
    finally:
        await pane.tmux("kill-server")


async def test_what_is_typed_while_an_answer_streams_stays_on_an_input_line_of_its_own() -> None:
    async with (
        gateway(SLOW_STORY, Reply(text="Short, as you asked.")) as (gw, fake),
        terminal("chat", "-t", gw.target) as pane,
    ):
        await pane.expect(r"^you>$")
        await pane.keys("Tell me a long story.", "Enter")
        await pane.expect("there was a long story there was")
        await pane.keys("Make it short")  # typed, not yet sent, while the answer streams
        screen = await pane.expect(r"^steer> Make it short$")
        answer = [line for line in screen.splitlines() if "there was a long story" in line]
        assert answer and not any("Make it" in line for line in answer), screen
        await pane.keys(".", "Enter")
        await pane.expect(r"↳ steered: Make it short\.")
        await pane.expect(r"^Short, as you asked\.\ncompleted · resp_\w+")
        await pane.expect(r"^you>$")
        await pane.keys("C-d")
        await pane.expect(r"^EXIT=0$")
    assert fake.chat_requests[1]["messages"][-1] == {"role": "user", "content": "Make it short."}


async def test_help_and_an_unknown_command_are_answered_in_the_terminal() -> None:
    async with gateway() as (gw, fake), terminal("chat", "-t", gw.target) as pane:
        await pane.expect(r"^you>$")
        await pane.keys("/help", "Enter")
        await pane.expect(r"^  /steer TEXT +steer it with TEXT")
        await pane.keys("/what", "Enter")
        await pane.expect("unknown command /what: /help lists the commands")
        await pane.keys("/quit", "Enter")
        await pane.expect(r"^EXIT=0$")
    assert fake.chat_requests == [], "nothing went to the model"


async def test_ctrl_c_while_ask_streams_is_one_line_and_exit_130() -> None:
    async with gateway(SLOW_STORY) as (gw, _), terminal("ask", "-t", gw.target, "Tell me a story.") as pane:
        await pane.expect("there was a long story there was")
        await pane.keys("C-c")
        screen = await pane.expect(r"^EXIT=130$")
    lines = screen.rstrip().splitlines()
    assert lines[-2:] == ["interrupted", "EXIT=130"] or lines[-2].endswith("interrupted"), screen
    assert "Traceback" not in screen


async def test_ctrl_c_at_the_approval_prompt_of_ask_is_one_line_and_exit_130() -> None:
    async with (
        gateway(Reply(tool_calls=[PARIS])) as (gw, _),
        terminal("ask", "-t", gw.target, "--tools", json.dumps([GUARDED]), "Weather in Paris?") as pane,
    ):
        await pane.expect(r'^approve get_weather \{"city": "Paris"\}\? \[y/n\]$')
        await pane.keys("C-c")
        screen = await pane.expect(r"^EXIT=130$")
    assert re.search(r"^interrupted\nEXIT=130$", screen, re.M), screen
    assert "Traceback" not in screen


async def test_a_yes_typed_ahead_while_ask_streams_does_not_approve_the_call_that_comes_after() -> None:
    talks_then_calls = Reply(text="Let me look that up for you first.", tool_calls=[PARIS], hold_at=4)
    async with (
        gateway(talks_then_calls, Reply(text="No weather, then.")) as (gw, fake),
        terminal("ask", "-t", gw.target, "--tools", json.dumps([GUARDED]), "Weather in Paris?") as pane,
    ):
        await fake.wait_held()
        await pane.expect("Let me")
        await pane.keys("y", "Enter")  # typed before there is anything to approve
        fake.release()
        await pane.expect(r'^approve get_weather \{"city": "Paris"\}\? \[y/n\]$')
        await pane.keys("n", "Enter")
        screen = await pane.expect(r"^EXIT=0$")
    assert "denied by the user" in screen and "No weather, then." in screen, screen
    assert "y" not in re.findall(r"\[y/n\] (\S*)", screen), screen


async def test_chat_shows_a_slow_models_words_as_they_come_not_only_once_their_line_is_whole() -> None:
    held = Reply(text="Alpha beta gamma delta epsilon.", hold_at=3)
    async with gateway(held) as (gw, fake), terminal("chat", "-t", gw.target) as pane:
        await pane.expect(r"^you>$")
        await pane.keys("Talk.", "Enter")
        await fake.wait_held()
        # The model holds mid-line: its words so far show above the input line.
        screen = await pane.expect(r"^Alpha beta\b.*\nsteer>$")
        assert "completed" not in screen
        fake.release()
        await pane.expect(r"^Alpha beta gamma delta epsilon\.\ncompleted · resp_\w+")
        await pane.keys("C-d")
        screen = await pane.expect(r"^EXIT=0$")
    assert screen.count("Alpha") == 1, screen
