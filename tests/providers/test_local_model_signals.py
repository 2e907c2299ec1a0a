"""The embedded model's child process and the terminal's Ctrl-C: a terminal sends SIGINT to its
foreground process group, and the child must not be in it, so that it goes on answering while the
gateway drains and exits only when the gateway closes its provider (last).

The llama.cpp child is heavy, so a stand-in child (the same start-up line, the same exit on stdin's
end) runs under the real LocalModelServer, inside a process that plays the gateway: started in a
session of its own as a shell starts a foreground job, it gets the group's SIGINT, then stops the
server as the gateway does, and prints how the child ended."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STAND_IN = textwrap.dedent(
    """
    import sys
    print("listening http://127.0.0.1:9/", flush=True)
    sys.stdin.buffer.read()  # returns when the owner closes stdin; SIGINT's default would kill it first
    """
)

OWNER = textwrap.dedent(
    """
    import asyncio, signal, sys
    from pathlib import Path
    from antwort_grpc.providers.local_model import LocalModelServer

    async def main() -> None:
        server = LocalModelServer(Path("unused.gguf"), command=[sys.executable, "-c", sys.argv[1]])
        await server.start()
        child = server._process
        interrupted = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, interrupted.set)
        print(f"child {child.pid}", flush=True)
        await interrupted.wait()
        await server.stop(timeout=30)  # what the gateway does last, once it has drained
        print(f"child ended {child.returncode}", flush=True)

    asyncio.run(main())
    """
)


async def test_a_ctrl_c_at_the_terminal_does_not_reach_the_embedded_models_child() -> None:
    owner = await asyncio.create_subprocess_exec(
        sys.executable, "-c", OWNER, STAND_IN, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    assert owner.stdout is not None
    async with asyncio.timeout(60):
        line = (await owner.stdout.readline()).decode()
        assert line.startswith("child "), line
        child = int(line.split()[1])
        assert os.getpgid(child) != owner.pid, "the child is in the owner's process group"
        os.killpg(owner.pid, signal.SIGINT)  # the terminal's Ctrl-C: the whole foreground group
        ended = (await owner.stdout.readline()).decode().strip()
        assert await owner.wait() == 0
    # 0: it exited because its owner closed its stdin; -2 would be SIGINT's doing.
    assert ended == "child ended 0"
