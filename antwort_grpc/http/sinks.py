"""The HTTP door's sink: the core's events as server-sent events for a request that streams, or
the last one kept for the JSON answer of one that does not."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Sequence
from typing import Any, Protocol

import grpc
from aiohttp import web

from antwort_grpc import pb
from antwort_grpc.errors import RequestError
from antwort_grpc.http.errors import error_json
from antwort_grpc.http.mapping import LIFECYCLE, echoed_tools_ready, encode, event_body, response_json, sse

log = logging.getLogger(__name__)

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Decoded(Protocol):
    """The request a body decoded to (None until the core has decoded it)."""

    decoded: pb.CreateResponseRequest | None


class EventWriter:
    """The events of one request. `body`: the create they answer (None: an attach, which always
    streams and always reads a background response).

    Sequence numbers are the client's own: 1, 2, 3 … over the events this stream sends it (the
    core's events it did not ask for, our extension events, are left out of the count as out of
    the stream). The numbering depends only on the response's log and on whether the client asked
    for extension events, so every replica gives an event the same number: an attach reads the
    log from its start, counts the same way, and sends what comes after `skip` (the client's
    `starting_after`)."""

    takes_wire = False  # every event is rendered as JSON

    def __init__(self, request: web.Request, extended: bool, body: Decoded | None, skip: int = 0) -> None:
        self.request = request
        self.extended = extended
        self.body = body
        self.skip = skip
        # The SSE response, once its headers went out.
        self.response: web.StreamResponse | None = None
        self.last: pb.StreamEvent | None = None
        # The client's number of the last event counted.
        self.number = 0
        # Whether the response in the events was created in background (known once the core has
        # decoded the request: at the first event).
        self.background = body is None

    def _streams(self) -> bool:
        decoded = self.body.decoded if self.body is not None else None
        if decoded is not None:
            self.background = decoded.background
        return decoded is None or decoded.stream

    async def event(self, event: pb.StreamEvent, wire: bytes | None) -> None:
        response = self.response
        if response is None:
            if not self._streams():
                self.last = event
                return
            response = await self._prepare()
        kind = event.WhichOneof("event")
        if kind in LIFECYCLE:  # not a coroutine per delta
            await echoed_tools_ready(getattr(event, kind).response)
        body = event_body(event, self.extended, self.background, kind)
        if body is None:
            return
        self.number += 1
        if self.number <= self.skip:
            return  # the client has it already
        body["sequence_number"] = self.number
        await response.write(sse(body))

    async def batch(self, events: Sequence[pb.StreamEvent], wires: Sequence[bytes]) -> None:
        for event in events:
            await self.event(event, None)

    async def logged(self, wires: Sequence[bytes], batched: bool) -> None:
        for data in wires:
            await self.event(pb.StreamEvent.FromString(data), None)

    async def _prepare(self) -> web.StreamResponse:
        response = self.response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(self.request)
        return response

    async def error(self, err: BaseException) -> None:
        """After the headers went out an error can only be an event (the spec's `error`): the
        core's own (a background response's log removed while it was read) as it is."""
        failure = err if isinstance(err, RequestError) else None
        if failure is None:
            log.error("the stream of a response failed", exc_info=err)
            failure = RequestError(grpc.StatusCode.INTERNAL, f"the stream failed: {type(err).__name__}")
        payload = error_json(failure)["error"]
        assert self.response is not None
        with contextlib.suppress(ConnectionError):
            await self.response.write(sse({"type": "error", "sequence_number": self.number + 1, "error": payload}))

    async def answered(self, work: Awaitable[None]) -> web.StreamResponse:
        """What the handler returns once the core's `work` is done: an error before the first
        event is raised (the error object), one after it is the stream's last event."""
        try:
            await work
        except RequestError as err:
            if self.response is None:
                raise
            await self.error(err)
        return await self.answer()

    async def answer(self) -> web.StreamResponse:
        """What the handler returns: the stream, ended; else the JSON of the last event's response."""
        if self.response is not None:
            with contextlib.suppress(ConnectionError):
                await self.response.write(b"data: [DONE]\n\n")  # the spec: every stream ends with it
                await self.response.write_eof()
            return self.response
        last = self.last
        assert last is not None, "the core sent no event"
        answer: pb.Response = getattr(last, str(last.WhichOneof("event"))).response
        await echoed_tools_ready(answer)
        return json_reply(response_json(answer, self.background))


def json_reply(value: Any) -> web.Response:
    """A JSON answer, encoded as the events are (mapping.encode)."""
    return web.Response(body=encode(value), content_type="application/json", charset="utf-8")
