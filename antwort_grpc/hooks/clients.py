"""The gateway's side of hooks: one client per configured hook, in-process or remote.

`--hook` / `ANTWORT_HOOKS` entries are `SPEC[;timeout=SECONDS][;failure=open|closed]`, where SPEC
is a gRPC target of a HookService (`127.0.0.1:50070`, `dns:///hooks:50070`) or the import path of
a PolicyHook class to run in-process (`examples.redact_hook:DenyAndRedact`).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
from google.protobuf.message import Message

from antwort_grpc import pb, tracing
from antwort_grpc.hooks.service import (
    MAX_MESSAGE_BYTES,
    POINT_OF,
    POINTS,
    Caller,
    Exchange,
    PolicyHook,
    current_caller,
    evaluate,
)
from antwort_grpc.hooks.session import SessionClient, SessionUnimplemented
from antwort_grpc.tasks import stop_task

log = logging.getLogger(__name__)

ALL_POINTS: frozenset[int] = frozenset(POINTS)
# A Python import path `package.module:Class` (a gRPC target ends in a port or names a scheme).
_CLASS_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_SCHEMES = {"dns", "unix", "unix-abstract", "ipv4", "ipv6", "vsock"}
_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.enable_retries", 0),
    ("grpc.service_config", json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})),
]


class HookClient(Protocol):
    """What the dispatcher needs of a hook, wherever it runs."""

    name: str  # for the logs: its name and where it runs
    label: str  # for the model and the client: its own name ("" when it has none), never an address
    target: str  # where it runs ("" in the gateway's process)
    timeout: float
    fail_open: bool

    def wants(self, point: int) -> bool:
        """Whether to call it at `point` (a hook whose points are unknown yet wants every point)."""
        ...

    async def exchange(self, calls: Sequence[Message], caller: Caller) -> Exchange:
        """Calls asked together (see `evaluate`); raises when none could be asked. The
        dispatcher bounds it by `timeout` per call."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class HookSpec:
    target: str
    timeout: float
    fail_open: bool

    @property
    def in_process(self) -> bool:
        scheme = self.target.split(":", 1)[0]
        return bool(_CLASS_PATH.match(self.target)) and scheme not in _SCHEMES


def parse_spec(text: str, default_timeout: float, default_fail_open: bool) -> HookSpec:
    """`SPEC[;timeout=SECONDS][;failure=open|closed]`; ValueError says what is wrong."""
    target, *options = [part.strip() for part in text.split(";")]
    if not target:
        raise ValueError(f"hook {text!r}: no target")
    timeout, fail_open = default_timeout, default_fail_open
    for option in options:
        key, _, value = option.partition("=")
        if key == "timeout":
            try:
                timeout = float(value)
            except ValueError:
                raise ValueError(f"hook {text!r}: timeout must be a number of seconds") from None
            if not 0 < timeout <= 60:
                raise ValueError(f"hook {text!r}: timeout must be more than 0 and at most 60 seconds")
        elif key == "failure" and value in ("open", "closed"):
            fail_open = value == "open"
        else:
            raise ValueError(f"hook {text!r}: unknown option {option!r} (timeout=SECONDS, failure=open|closed)")
    return HookSpec(target, timeout, fail_open)


class LocalHook:
    """A PolicyHook running in the gateway's process."""

    def __init__(self, hook: PolicyHook, timeout: float, fail_open: bool) -> None:
        self.hook = hook
        self.name = self.label = hook.name
        self.target = ""
        self.timeout = timeout
        self.fail_open = fail_open
        self._points = hook.points()

    def wants(self, point: int) -> bool:
        return point in self._points

    async def exchange(self, calls: Sequence[Message], caller: Caller) -> Exchange:
        token = current_caller.set(caller)
        try:
            return await evaluate(self.hook, calls)
        finally:
            current_caller.reset(token)

    async def start(self) -> None:
        await self.hook.start()

    async def close(self) -> None:
        await self.hook.close()


class RemoteHook:
    """A gRPC client of one HookService. Its points come from GetHookInfo at start; a service that
    does not answer then is asked again in the background until it does, and meanwhile counts as
    wanting every point, so its failure policy applies instead of it being skipped. A service that
    implements Session gets every exchange through it; others get one unary RPC per call."""

    def __init__(self, target: str, timeout: float, fail_open: bool, retry_interval: float = 1.0) -> None:
        self.target = target
        self.name = target
        self.label = ""
        self.timeout = timeout
        self.fail_open = fail_open
        self.retry_interval = retry_interval
        self._points: frozenset[int] | None = None
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None
        self._watcher: asyncio.Task[None] | None = None
        self._session: SessionClient | None = None
        self.known = asyncio.Event()

    def wants(self, point: int) -> bool:
        return self._points is None or point in self._points

    async def start(self) -> None:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self.target, options=_CHANNEL_OPTIONS)
            self._stub = pb.HookServiceStub(self._channel)
        if not await self._fetch_info(wait=False):
            self._watcher = asyncio.create_task(self._watch(), name=f"hook-watch {self.target}")

    async def close(self) -> None:
        await stop_task(self._watcher)
        if self._session is not None:
            await self._session.close()
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def _watch(self) -> None:
        while True:
            if await self._fetch_info(wait=True):
                return
            # A pause only after an answer that was an error (the wait above covers a service
            # that is down): UNIMPLEMENTED, say, would otherwise be asked in a tight loop.
            await asyncio.sleep(self.retry_interval)

    async def _fetch_info(self, *, wait: bool) -> bool:
        try:
            info = await self._stub.GetHookInfo(
                pb.GetHookInfoRequest(), timeout=max(self.timeout, self.retry_interval), wait_for_ready=wait
            )
        except grpc.aio.AioRpcError as err:
            if not wait:
                log.warning("hook service %s is unavailable: %s: %s", self.target, err.code().name, err.details())
            return False
        self._points = frozenset(p for p in info.points if p in POINTS)
        if info.session and self._session is None:
            self._session = SessionClient(self._stub, self.target)
        if info.name:
            self.name = f"{info.name} ({self.target})"
            self.label = info.name
        log.info("hook service %s wants %s", self.name, sorted(POINTS[p].method for p in self._points))
        self.known.set()
        return True

    async def exchange(self, calls: Sequence[Message], caller: Caller) -> Exchange:
        if self._stub is None:
            raise RuntimeError(f"hook service {self.target} is not started")
        if self._points is None:
            raise RuntimeError(f"hook service {self.target} is unavailable (it has not answered GetHookInfo yet)")
        metadata = _metadata(caller)
        if self._session is not None:
            try:
                return await self._session.exchange(calls, _caller(metadata), self.timeout * len(calls))
            except SessionUnimplemented:
                # It said it has Session, but has not: one RPC per call from now on.
                log.warning("hook service %s does not implement Session after all", self.name)
                self._session = None
        answers: list[Message] = []
        for request in calls:
            rpc = getattr(self._stub, POINTS[POINT_OF[type(request)]].rpc)
            try:
                reply: Message = await rpc(request, timeout=self.timeout, metadata=metadata, wait_for_ready=False)
            except grpc.aio.AioRpcError as err:
                return Exchange(answers, f"{err.code().name}: {err.details()}")
            answers.append(reply)
            if reply.ByteSize():
                break
        return Exchange(answers)


def _caller(metadata: tuple[tuple[str, str], ...]) -> pb.HookCaller:
    """What the unary RPCs carry as metadata, for a Session exchange."""
    caller = Caller.from_metadata(metadata)
    return pb.HookCaller(owner=caller.owner, traceparent=caller.traceparent, tracestate=caller.tracestate)


def _metadata(caller: Caller) -> tuple[tuple[str, str], ...]:
    """The caller's identity, and the trace context: the gateway's current span when it traces
    (the hook call is then its child), else the caller's as it came in."""
    traced = tracing.metadata()
    if traced is None:
        return caller.metadata()
    owner = (("antwort-owner", caller.owner),) if caller.owner else ()
    return traced + owner


def load_hook_class(path: str) -> PolicyHook:
    """An instance of the PolicyHook class at `module:Class`; ValueError says what is wrong."""
    module_name, _, class_name = path.partition(":")
    # Like `python -m`: a module next to where the command runs (examples/, your project) imports.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"cannot load hook {path}: {error}") from error
    hook = cls()
    if not isinstance(hook, PolicyHook):
        raise ValueError(f"hook {path!r} is not a PolicyHook subclass")
    return hook


def build_hooks(entries: Iterable[str], default_timeout: float, default_fail_open: bool) -> list[HookClient]:
    """One client per entry, in order (hooks are called in this order)."""
    hooks: list[HookClient] = []
    for entry in entries:
        if not entry.strip():
            continue
        spec = parse_spec(entry, default_timeout, default_fail_open)
        if spec.in_process:
            hooks.append(LocalHook(load_hook_class(spec.target), spec.timeout, spec.fail_open))
        else:
            hooks.append(RemoteHook(spec.target, spec.timeout, spec.fail_open))
    return hooks
