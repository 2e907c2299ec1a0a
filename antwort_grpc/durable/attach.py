"""Reading a background response's event log: the events after a sequence number, then the live
ones as they are appended (here or on another replica), to the terminal event.

The checks come first, so a bad attach is a status, never a broken stream: NOT_FOUND for an id
this caller does not own, OUT_OF_RANGE for a sequence number beyond the log, FAILED_PRECONDITION
for a log that is no longer kept (expired, over its size cap, or never kept: only the final
response is left, through GetResponse).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator

import grpc

from antwort_grpc.errors import FieldViolation, RequestError, invalid_argument, not_found
from antwort_grpc.storage.base import ResponseStore
from antwort_grpc.storage.runlog import EventLog, LogState

# Events read from the store at once.
PAGE = 512
# A reader looks at the log this often even when nobody told it of an append (a notification
# lost while a session reconnected; a replica that died, until another resumes the run).
RECHECK = 1.0


def _gone(response_id: str, what: str) -> RequestError:
    message = (
        f"response {response_id!r}: {what}; what is left is the final response: read it "
        f"(GetResponse, or GET /v1/responses/{response_id} without stream)"
    )
    return RequestError(
        grpc.StatusCode.FAILED_PRECONDITION,
        message,
        [FieldViolation("response_id", message)],
        "event_log_unavailable",
    )


async def check_attach(
    runlog: EventLog, store: ResponseStore, response_id: str, owner: str, starting_after: int, max_bytes: int
) -> LogState:
    """The log's state when an attach may read it; else the RequestError that says why not."""
    if starting_after < 0:
        raise invalid_argument([FieldViolation("starting_after", "must be 0 or a sequence number the client read")])
    state = await runlog.state(response_id, owner)
    if state is None:
        if await store.get(response_id, owner) is None:
            raise not_found("response", response_id, "response_id")
        raise _gone(
            response_id,
            "no event log is kept for it (it was not created in background, or its log expired and was removed)",
        )
    if state.truncated:
        raise _gone(
            response_id,
            f"its event log went over the cap of {max_bytes} bytes per response "
            "(ANTWORT_BACKGROUND_LOG_MAX_BYTES) and keeps only the final response",
        )
    if state.expired:
        raise _gone(response_id, "its event log expired (ANTWORT_BACKGROUND_LOG_RETENTION_SECONDS after it ended)")
    if starting_after > state.last_sequence_number:
        message = f"starting_after {starting_after} is beyond the last event of the log ({state.last_sequence_number})"
        raise RequestError(
            grpc.StatusCode.OUT_OF_RANGE, message, [FieldViolation("starting_after", message)], "out_of_range"
        )
    return state


async def follow(
    runlog: EventLog, response_id: str, owner: str, starting_after: int
) -> AsyncIterator[tuple[int, bytes]]:
    """(sequence number, event bytes) after `starting_after`, to the terminal event."""
    pages = follow_pages(runlog, response_id, owner, starting_after)
    try:
        async for page in pages:
            for event in page:
                yield event
    finally:
        await pages.aclose()  # its watch of the log ends with this reader, not when collected


async def follow_pages(
    runlog: EventLog, response_id: str, owner: str, starting_after: int
) -> AsyncGenerator[list[tuple[int, bytes]], None]:
    """`follow`'s events in the pages they were read in (none empty): the replay up to PAGE
    at a time, then what each of the run's flushes appended."""
    appended = asyncio.Event()
    unwatch = runlog.watch(response_id, appended.set)
    cursor = starting_after
    try:
        while True:
            appended.clear()
            page = await runlog.events(response_id, cursor, PAGE)
            fresh = [(seq, data) for seq, data in page if seq > cursor]
            if fresh:
                cursor = fresh[-1][0]
                yield fresh
            if len(page) == PAGE:
                continue
            state = await _state(runlog, response_id, owner)
            if cursor < state.last_sequence_number:
                continue  # appended since the page was read
            if state.ended:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RECHECK):
                    await appended.wait()
    finally:
        unwatch()


async def _state(runlog: EventLog, response_id: str, owner: str) -> LogState:
    state = await runlog.state(response_id, owner)
    if state is None or state.expired:
        raise _gone(response_id, "its event log was removed while it was read")
    if state.truncated:
        raise _gone(response_id, "its event log went over its size cap while it was read")
    return state
