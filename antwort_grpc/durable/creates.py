"""Creates that outlive their call: background responses and idempotency keys, for every door.

`begin` starts a create that is background or carries an idempotency key (a plain create never
comes here): it binds the key to the response first, so a retry of the same create — on any
replica, while the first still runs or after — finds that response instead of starting another
run; the same key with a different create is refused. `attach` reads a background response's
event log (durable/attach.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

import grpc

from antwort_grpc import ids, pb
from antwort_grpc.durable.attach import check_attach, follow, follow_pages
from antwort_grpc.durable.runner import Runner, snapshot
from antwort_grpc.durable.settings import DurableSettings
from antwort_grpc.durable.takeover import Admits, Background
from antwort_grpc.engine.run import Run
from antwort_grpc.errors import RESOURCE_TYPES, FieldViolation, RequestError, Resource, invalid_argument
from antwort_grpc.hooks.service import Caller
from antwort_grpc.responses.service import Responses
from antwort_grpc.storage.base import RUNNING
from antwort_grpc.storage.runlog import RunLog

__all__ = ["IDEMPOTENCY_KEY", "Begun", "Durability", "DurableParts", "digest", "idempotency_key", "snapshot"]

# The request metadata entry a client names a create with, to retry it safely.
IDEMPOTENCY_KEY = "idempotency-key"
# Visible ASCII without spaces, as most APIs take them (a UUID fits).
_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")
# Polling the store for the end of a retried create that is not background (and for the
# response of a create still starting): first and longest gap.
END_POLL = (0.01, 0.5)
# The longest a retried create waits for the first one to store its response (and begin its
# log): a before-response hook may take its whole timeout.
KEY_WAIT = 10.0


def _reused(key: str, response_id: str) -> RequestError:
    message = (
        f"idempotency key {key!r} was used by a different create (response {response_id!r}): "
        "a retry must repeat the request exactly; use a new key for a new request"
    )
    return RequestError(
        grpc.StatusCode.FAILED_PRECONDITION,
        message,
        [FieldViolation(IDEMPOTENCY_KEY, message)],
        "idempotency_key_reused",
    )


def _pending(key: str, response_id: str) -> RequestError:
    return RequestError(
        grpc.StatusCode.ABORTED,
        f"idempotency key {key!r} names response {response_id!r}, whose create is still starting "
        f"(after {KEY_WAIT:.0f}s): retry the same create with the same key",
        reason="idempotency_key_pending",
        resource=Resource(RESOURCE_TYPES["response"], response_id, "being created"),
    )


def unavailable() -> RequestError:
    """What a durable create or an attach meets on a gateway whose store keeps no event log."""
    return RequestError(
        grpc.StatusCode.FAILED_PRECONDITION,
        "this gateway's store keeps no event log: background responses and idempotency keys need the "
        "memory, SQLite or PostgreSQL store",
        reason="durable_unavailable",
    )


def idempotency_key(metadata: object) -> str | None:
    """The create's idempotency key (None: it has none); INVALID_ARGUMENT when malformed."""
    for entry in metadata or ():  # type: ignore[attr-defined]
        key, value = entry[0], entry[1]
        if key == IDEMPOTENCY_KEY:
            text = value if isinstance(value, str) else ""
            if not _KEY.match(text):
                raise invalid_argument(
                    [FieldViolation(IDEMPOTENCY_KEY, "1 to 255 visible ASCII characters, no spaces (a UUID, say)")]
                )
            return text
    return None


def digest(request: pb.CreateResponseRequest) -> str:
    """What makes two creates the same: every field but `stream` (a retry may read it either way)."""
    copy = pb.CreateResponseRequest()
    copy.CopyFrom(request)
    copy.stream = False
    return hashlib.sha256(copy.SerializeToString(deterministic=True)).hexdigest()


@dataclass(slots=True)
class Begun:
    """What a durable create started, or found."""

    # The run started here (None: the key named a response that exists already).
    run: Run | None
    runner: Runner | None
    response_id: str
    # The key named an earlier create's response.
    replayed: bool = False
    # That response keeps an event log (it is background): attach reads it.
    logged: bool = False


@dataclass(frozen=True, slots=True)
class DurableParts:
    """What the composition root builds durable runs with, over the responses layer: the store's run
    log, the settings, and what a run taken over counts against here."""

    runlog: RunLog
    settings: DurableSettings
    admits: Admits | None = None


class Durability:
    def __init__(self, responses: Responses, parts: DurableParts) -> None:
        self.responses = responses
        self.runlog = parts.runlog
        self.settings = parts.settings
        self.background = Background(responses.engine, responses.store, parts.runlog, parts.settings, parts.admits)

    async def begin(
        self,
        request: pb.CreateResponseRequest,
        *,
        owner: str,
        key: str | None,
        timeout: float | None = None,
        caller: Caller | None = None,
    ) -> Begun:
        if key is not None and request.HasField("store") and not request.store:
            raise invalid_argument(
                [FieldViolation(IDEMPOTENCY_KEY, "a create with an idempotency key is stored: it needs store")]
            )
        response_id = ""
        if key is not None:
            # Checked before the key is bound: a create that could never start binds nothing.
            await self.responses.check(request)
            response_id = ids.response_id()
            replayed = await self._bind(request, owner, key, response_id)
            if replayed is not None:
                return replayed
        if request.background and not request.stream:
            # Its events are logged for whoever attaches: the model streams them, whatever this
            # call reads.
            streamed = pb.CreateResponseRequest()
            streamed.CopyFrom(request)
            streamed.stream = True
            request = streamed
        try:
            run = await self.responses.create(
                request,
                owner=owner,
                timeout=None if request.background else timeout,
                # A background run waits for approvals (up to the approval timeout): whoever
                # attaches, or ControlResponse from anywhere, decides them.
                controller=request.background,
                caller=caller,
                response_id=response_id,
            )
        except BaseException:
            if key is not None:
                await self.runlog.forget(owner, key)
            raise
        runner = await self._log(run, owner, key) if request.background else None
        return Begun(run, runner, run.response_id, logged=runner is not None)

    async def _log(self, run: Run, owner: str, key: str | None) -> Runner:
        """The run logged, leased and started in background; a store that cannot keep its log
        leaves it cancelled (stored, but with no runner it would stay in progress for ever) and
        lets its idempotency key go: UNAVAILABLE asks the client to retry, and the retry should
        run, not find the cancelled response."""
        try:
            return await self.background.begin(run)
        except Exception as error:
            run.stop("cancelled")
            async with contextlib.aclosing(run.events()) as events:
                async for _ in events:
                    pass
            if key is not None:
                with contextlib.suppress(Exception):  # the store may be down altogether
                    await self.runlog.forget(owner, key)
            description = "cancelled: the store could not keep its event log"
            raise RequestError(
                grpc.StatusCode.UNAVAILABLE,
                f"the store could not keep the event log ({type(error).__name__}): "
                f"response {run.response_id!r} was cancelled; try again",
                reason="store_unavailable",
                resource=Resource(RESOURCE_TYPES["response"], run.response_id, description),
            ) from error

    async def _bind(self, request: pb.CreateResponseRequest, owner: str, key: str, response_id: str) -> Begun | None:
        """Bind the key to `response_id` (None: bound, the create runs) or find the response it
        names. That response may not be there yet: its create bound the key first and is still
        preparing it (history, hooks, the first write). A retry waits for it — the store's
        record, and for a background create its event log — so it never reads a response that
        is not there yet; if the first create is refused meanwhile, its key is let go and this
        one binds it. Past KEY_WAIT: ABORTED, which the documented retry policy retries."""
        wanted = digest(request)
        delay, longest = END_POLL
        deadline = asyncio.get_running_loop().time() + KEY_WAIT
        while True:
            found = await self.runlog.remember(owner, key, wanted, response_id, self.settings.idempotency_ttl_seconds)
            if found is None:
                return None
            if found.digest != wanted:
                raise _reused(key, found.response_id)
            if await self._exists(found.response_id, owner, request.background):
                return Begun(None, None, found.response_id, replayed=True, logged=request.background)
            if asyncio.get_running_loop().time() >= deadline:
                raise _pending(key, found.response_id)
            await asyncio.sleep(delay)
            delay = min(delay * 2, longest)

    async def _exists(self, response_id: str, owner: str, background: bool) -> bool:
        """Whether a create's response can be read as its retry reads it: a background one by its
        log (begun after the response was stored), any other in the store. The digests are
        equal, so the retry is background exactly when the first create was."""
        if background:
            return await self.runlog.state(response_id, owner) is not None
        return await self.responses.store.get(response_id, owner) is not None

    async def attach_check(self, response_id: str, owner: str, starting_after: int) -> None:
        self.responses.require_id(response_id)
        await check_attach(
            self.runlog, self.responses.store, response_id, owner, starting_after, self.settings.log_max_bytes
        )

    def follow(self, response_id: str, owner: str, starting_after: int) -> AsyncIterator[tuple[int, bytes]]:
        return follow(self.runlog, response_id, owner, starting_after)

    def follow_pages(
        self, response_id: str, owner: str, starting_after: int
    ) -> AsyncGenerator[list[tuple[int, bytes]], None]:
        return follow_pages(self.runlog, response_id, owner, starting_after)

    async def stored_answer(self, begun: Begun, owner: str) -> pb.StreamEvent:
        """What a retried create that neither streams its log nor owns a run answers: the
        response as stored (one that is not background: once it ended), as its terminal event."""
        if begun.logged:
            record = await self.responses.store.get(begun.response_id, owner)
            response = record.response if record is not None else pb.Response()
        else:
            response = await self.ended(begun.response_id, owner)
        return snapshot(response)

    async def ended(self, response_id: str, owner: str) -> pb.Response:
        """The response once it is no longer running (a retried create that is not background)."""
        delay, longest = END_POLL
        while True:
            record = await self.responses.store.get(response_id, owner)
            if record is None:
                raise RequestError(grpc.StatusCode.NOT_FOUND, f"response {response_id!r} is gone", reason="not_found")
            if record.response.status not in RUNNING:
                return record.response
            await asyncio.sleep(delay)
            delay = min(delay * 2, longest)
