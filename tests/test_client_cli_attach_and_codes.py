"""The CLI's loose ends a newcomer tripped on, through pipes against a real gateway: `attach`'s own
flags, its approvals and its "continue with" line, a keyed `ask` that streams, the time and usage of
a run not followed from its start, one error line, `/follow` acknowledged, and the exit codes."""

from __future__ import annotations

import asyncio
import json
import re

from antwort_grpc import pb
from antwort_grpc.testing.fake_openai import Reply
from tests.harness import GatewayClient
from tests.test_client_cli import GUARD, GUARDED, PARIS, Cli, ask, ask_command, gateway


async def test_attach_help_lists_only_what_following_a_run_takes() -> None:
    code, out = await ask_command("attach", "--help")
    assert code == 0, out
    for flag in ("--after", "--approve-all", "--deny-all", "--json", "--timeout", "--target", "--token"):
        assert flag in out, flag
    for flag in ("--model", "--instructions", "--tools", "--tool-choice", "--previous"):
        assert flag not in out, f"attach --help offers {flag}, which attaching never uses"


async def test_attach_from_a_pipe_asks_once_and_ends_with_the_command_that_continues_the_run() -> None:
    async with gateway(Reply(tool_calls=[PARIS])) as (gw, fake):
        cli = await Cli.start("ask", "-t", gw.target, "--background", "--tools", json.dumps([GUARDED]), "Weather?")
        code = await cli.finish()
        assert code == 0, cli.output
        match = re.search(r"^(resp_\w+)$", cli.output, re.M)
        assert match is not None, cli.output
        response_id = match[1]
        first = await Cli.start("attach", "-t", gw.target, response_id)
        await first.expect(r'approve get_weather \{"city": "Paris"\}\? \[y/n\] $')
        await first.type("y")
        assert await first.finish() == 0, first.output
        # Attached again, the log's approval request was decided already: no prompt, nothing read.
        again = await Cli.start("attach", "-t", gw.target, response_id)
        await again.type("y")
        assert await again.finish() == 0, again.output
    assert "[y/n]" not in again.output, again.output
    assert "not accepted" not in again.output
    for out in (first.output, again.output):
        hint = re.search(rf"^continue with: antwort-grpc ask --previous {response_id} --tools '(.*)' (.*)$", out, re.M)
        assert hint is not None, out
        assert json.loads(hint[1])[0]["function"]["name"] == "get_weather"
        assert hint[2] == "--output call_paris='RESULT'"
    assert len(fake.chat_requests) == 1


async def test_attach_after_n_to_a_finished_run_shows_the_time_it_ran_not_the_replay_s() -> None:
    async with gateway(Reply(text="Bonjour.", first_delay=0.5)) as (gw, _):
        cli = await Cli.start("ask", "-t", gw.target, "--background", "Say hello.")
        await cli.finish()
        match = re.search(r"^(resp_\w+)$", cli.output, re.M)
        assert match is not None, cli.output
        code, followed = await ask_command("attach", "-t", gw.target, match[1])  # to its end
        assert code == 0 and "completed · " in followed, followed
        code, out = await ask_command("attach", "-t", gw.target, "--after", "3", match[1])
    assert code == 0, out
    took = re.search(rf"^completed · {match[1]} · fake-model · \d+ in / \d+ out tokens · ran (\d+\.\d) s$", out, re.M)
    assert took is not None, out
    assert float(took[1]) >= 0.5, "the model alone took half a second"


async def test_ask_with_an_idempotency_key_streams_and_a_retry_shows_the_same_answer() -> None:
    async with gateway(Reply(text="Bonjour tout le monde !", hold_at=2)) as (gw, fake):
        first = await Cli.start("ask", "-t", gw.target, "--idempotency-key", "k-1", "Say hello in French.")
        await fake.wait_held()
        await first.expect("Bonjour")  # streamed while the model is still answering
        fake.release()
        assert await first.finish() == 0, first.output
        code, retried = await ask("-t", gw.target, "--idempotency-key", "k-1", "Say hello in French.")
    assert code == 0, retried
    pattern = r"^Bonjour tout le monde !\ncompleted · (resp_\w+) · fake-model · "
    original, again = re.search(pattern, first.output, re.M), re.search(pattern, retried, re.M)
    assert original is not None and again is not None, (first.output, retried)
    assert original[1] == again[1]
    assert len(fake.chat_requests) == 1, "the retry started nothing"


async def test_a_cancelled_ask_exits_3_and_does_not_claim_zero_tokens() -> None:
    held = Reply(text="A long answer " + "and more " * 200, hold_at=3)
    slow = Reply(text="A long answer " + "and more " * 400, delay=0.02)
    async with gateway(held, slow) as (gw, fake):
        cli = await Cli.start("ask", "-t", gw.target, "--json", "Talk.")
        created = await cli.expect(r'"created": \{"response": \{"id": "(resp_\w+)"')
        await fake.wait_held()
        await gw.stub.CancelResponse(pb.CancelResponseRequest(response_id=created[1]))
        fake.release()
        assert await cli.finish() == 3, cli.output
        human = await Cli.start("chat", "-t", gw.target)
        await human.type("Talk.")
        await human.expect("A long answer")
        await human.type("/cancel")
        await human.expect(r"cancelled · resp_\w+ .*")
        assert await human.finish() == 3, human.output
    status = re.search(r"^cancelled · resp_\w+ · fake-model · (.*) · \d+\.\d s$", human.output, re.M)
    assert status is not None and status[1] == "tokens not counted", human.output


async def test_a_failed_or_incomplete_ask_exits_1_and_a_completed_one_0() -> None:
    async with gateway(Reply(text="Cut", finish_reason="length"), Reply(text="Done.")) as (gw, _):
        code, out = await ask("-t", gw.target, "Talk.")
        assert code == 1 and "incomplete · " in out, out
        code, out = await ask("-t", gw.target, "Talk.")
        assert code == 0 and "completed · " in out, out


async def test_an_error_line_does_not_repeat_its_message() -> None:
    async with gateway() as (gw, _):
        code, out = await ask_command("attach", "-t", gw.target, "resp_0123456789abcdef01234567")
    assert code == 2
    assert out.strip() == (
        "antwort-grpc attach: NOT_FOUND: response 'resp_0123456789abcdef01234567' not found (response_id)"
    ), out


async def until_follow_up_waits(gw: GatewayClient) -> None:
    """Until a running response of the gateway holds a follow-up (a state of the run: no event)."""
    runs = gw.gateway.engine.runs

    def waiting() -> bool:
        return any((run := runs.get(rid)) is not None and run.follow_up_waiting for rid in runs.running())

    async with asyncio.timeout(GUARD):
        while not waiting():  # noqa: ASYNC110 - a state of the run, not an event
            await asyncio.sleep(0.01)


async def test_a_follow_up_is_acknowledged_when_sent_and_shown_when_it_is_taken() -> None:
    held = Reply(text="A first answer that goes on.", hold_at=2)
    async with gateway(held, Reply(text="And the follow-up's answer.")) as (gw, fake):
        chat = await Cli.start("chat", "-t", gw.target)
        await chat.type("Talk.")
        await fake.wait_held()
        await chat.type("/follow and then?")
        await chat.expect(r"follow-up sent: and then\? \(answered once this answer ends\)")
        # "sent" is the client's word when it queues the control on its stream; the held answer is
        # let go once the gateway has it (else a loaded host can end the answer first: a race of
        # the test's, which the client reports as "did not take effect").
        await until_follow_up_waits(gw)
        fake.release()
        await chat.expect(r"↳ follow-up: and then\?")
        await chat.expect(r"And the follow-up's answer\.\ncompleted · ")
        assert await chat.finish() == 0, chat.output
