"""The neutral edge around the responses layer, the same for every front door: who is calling (a
credential becomes an Identity), whether their response may start (each principal's limit of
responses at once), and observing each response stream (metrics, traces, the log line).

A door (the gRPC servicer today) only converts: it hands the edge the credential it read and the
metadata it got, wraps the response stream it serves in `Edge.stream`, and turns the RequestErrors
raised here into its own errors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace

from antwort_grpc import pb
from antwort_grpc.auth.identity import Authenticator, AuthError, Identity
from antwort_grpc.errors import RequestError
from antwort_grpc.observability.context import Observation, current_observation
from antwort_grpc.observability.observer import Observer

Metadata = Collection[tuple[str, Any]]


class ConcurrencyLimit:
    """How many responses each principal runs at once, across its connections (and doors)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running: dict[str, int] = {}

    def acquire(self, principal: str) -> bool:
        count = self.running.get(principal, 0)
        if count >= self.limit:
            return False
        self.running[principal] = count + 1
        return True

    def release(self, principal: str) -> None:
        count = self.running.get(principal, 0) - 1
        if count > 0:
            self.running[principal] = count
        else:
            self.running.pop(principal, None)


class Watch:
    """One response stream as the edge sees it: every event it carries goes through `saw`."""

    __slots__ = ("_metadata", "_observation", "_observer", "cut")

    def __init__(self, observer: Observer | None, observation: Observation | None, metadata: Metadata) -> None:
        self._observer = observer
        self._observation = observation
        self._metadata = metadata
        # How the stream ended if it ends early: refused before its first event, or cut after it.
        self.cut = "refused"

    def saw(self, event: pb.StreamEvent) -> None:
        self.cut = "client_gone"
        if self._observer is not None:
            assert self._observation is not None
            self._observer.event(self._observation, event, self._metadata)

    def ended(self) -> None:
        """The stream ran to its end (not cut)."""
        self.cut = "stream_ended"


class Edge:
    def __init__(
        self,
        authenticator: Authenticator | None = None,
        limit: ConcurrencyLimit | None = None,
        observer: Observer | None = None,
    ) -> None:
        self.authenticator = authenticator
        self.limit = limit
        self.observer = observer

    @property
    def authenticates(self) -> bool:
        return self.authenticator is not None

    async def identify(self, credential: str | AuthError) -> Identity:
        """The caller a credential names (or the door's reason it has none); UNAUTHENTICATED else."""
        assert self.authenticator is not None
        try:
            if isinstance(credential, AuthError):
                raise credential
            return await self.authenticator.authenticate(credential)
        except AuthError as err:
            raise RequestError(grpc.StatusCode.UNAUTHENTICATED, str(err), reason="unauthenticated") from None

    @asynccontextmanager
    async def stream(self, method: str, identity: Identity | None, metadata: Metadata) -> AsyncIterator[Watch]:
        """A response stream of `identity`'s: a slot of their limit for as long as it runs
        (RESOURCE_EXHAUSTED when none is free), and its observation (current for the stream's
        task and every task it starts, so model and tool calls hang under its span)."""
        principal = identity.principal if identity is not None else ""
        limit = self.limit
        if limit is not None and not limit.acquire(principal):
            raise RequestError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"at most {limit.limit} responses may run at once for one caller",
                reason="too_many_responses",
            )
        observer = self.observer
        observation = observer.begin(method, metadata) if observer is not None else None
        token = None
        if observation is not None:
            current_observation.set(observation)
            if observation.span is not None:
                token = otel_context.attach(trace.set_span_in_context(observation.span))
        watch = Watch(observer, observation, metadata)
        try:
            yield watch
        finally:
            if observer is not None and observation is not None:
                observer.end(observation, watch.cut)
            if token is not None:
                otel_context.detach(token)
            if limit is not None:
                limit.release(principal)
