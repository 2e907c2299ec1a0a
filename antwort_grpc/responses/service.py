"""The responses layer: what every front door does with a request, whatever the transport.

It validates, starts runs, and reads, deletes, cancels and controls responses wherever they run:
in this process (the engine's registry) or on another replica (through the store's signals).
Failures are RequestErrors (a gRPC status code, field violations, a reason); a front door only
converts them.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc

from antwort_grpc import pb
from antwort_grpc.engine import Engine
from antwort_grpc.engine.run import Run
from antwort_grpc.errors import FieldViolation, RequestError, invalid_argument, not_found
from antwort_grpc.hooks.service import Caller
from antwort_grpc.providers.base import Capabilities
from antwort_grpc.responses.admission import hook_run
from antwort_grpc.responses.controls import check_control
from antwort_grpc.responses.conversations import check_conversation
from antwort_grpc.responses.files import has_files, read_files
from antwort_grpc.responses.pages import item_list, page_limit
from antwort_grpc.responses.references import references, resolve_references
from antwort_grpc.responses.request_limits import DEFAULT_LIMITS, Limits
from antwort_grpc.responses.servable import check_servable
from antwort_grpc.responses.validation import check_create, check_id, validate_create, validate_policy
from antwort_grpc.storage.base import RUNNING, CancelSignals, ControlSignals, ResponseStore, StoredResponse

S = pb.ResponseStatus

# How long a cancel waits for the stopped response to be stored.
CANCEL_WAIT = 10.0
# Polling the store for the end of a response cancelled on another replica: first and longest gap.
CANCEL_POLL = (0.01, 0.2)


class Responses:
    def __init__(
        self,
        engine: Engine,
        store: ResponseStore,
        limits: Limits = DEFAULT_LIMITS,
        served: Capabilities | None = None,
    ) -> None:
        self.engine = engine
        self.store = store
        self.limits = limits
        # What the model backend is known not to do: refused before a response is created.
        self.served = served or Capabilities()

    @property
    def hooked(self) -> bool:
        """Whether hooks are configured (only they need to know who calls, beyond the owner)."""
        return self.engine.config.hooks is not None

    async def create(
        self,
        request: pb.CreateResponseRequest,
        *,
        owner: str = "",
        timeout: float | None = None,
        controller: bool = False,
        caller: Caller | None = None,
        response_id: str = "",
    ) -> Run:
        """A started (and stored) response; iterate `run.events()` to run it. `response_id`: the
        id to give it (durable/creates.py binds an idempotency key to it first)."""
        await self.check(request)
        server = self.engine.server_limits
        if request.WhichOneof("input") == "input_items" and (positions := references(request)):
            request = await resolve_references(request, positions, self.store, owner)
        if has_files(request):
            request = await read_files(request, self.limits.max_request_bytes)

        def problems(replaced: pb.CreateResponseRequest) -> list[str]:
            found = validate_create(replaced, self.limits) + validate_policy(replaced, server)
            if references(replaced):
                found.append(FieldViolation("input_items", "a hook's request cannot hold item references"))
            return [f"{v.field}: {v.description}" for v in found]

        hooks = hook_run(self.engine.config.hooks, request, caller, owner)
        return await self.engine.start(
            request,
            owner=owner,
            timeout=timeout,
            controller=controller,
            hook_run=hooks,
            problems=problems,
            response_id=response_id,
        )

    async def check(self, request: pb.CreateResponseRequest) -> None:
        """What a create is refused for before anything starts (INVALID_ARGUMENT and the like)."""
        await check_create(request, self.limits)
        check_servable(request, self.served, self.engine.config.default_model)
        violations = validate_policy(request, self.engine.server_limits)
        if request.conversation_id:
            violations += check_conversation(request)
        if violations:
            raise invalid_argument(violations)

    def require_id(self, response_id: str) -> None:
        _require_id(response_id)

    async def get(self, response_id: str, owner: str = "") -> pb.Response:
        _require_id(response_id)
        record = await self.store.get(response_id, owner)
        if record is not None:
            return record.response
        run = self.engine.runs.get(response_id, owner)
        if run is None:
            raise not_found("response", response_id, "response_id")
        return run.response  # store=false: only the running process knows it

    async def delete(self, response_id: str, owner: str = "") -> None:
        _require_id(response_id)
        if not await self.store.delete(response_id, owner):
            raise not_found("response", response_id, "response_id")

    async def list_input_items(
        self, response_id: str, *, limit: int, after: str, descending: bool, owner: str = ""
    ) -> pb.ListInputItemsResponse:
        _require_id(response_id)
        page = await self.store.list_input_items(
            response_id, limit=page_limit(limit), after=after, descending=descending, owner=owner
        )
        if page is None:
            raise not_found("response", response_id, "response_id")
        return item_list(pb.ListInputItemsResponse, page.items, page.has_more)

    async def cancel(self, response_id: str, owner: str = "") -> pb.Response:
        """Stop a response wherever it runs; the response once stored as stopped."""
        _require_id(response_id)
        run = self.engine.runs.get(response_id, owner)
        if run is not None:
            run.stop("cancelled")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CANCEL_WAIT):
                    await run.done.wait()
            record = await self.store.get(response_id, owner)
            return record.response if record else run.response
        record = await self._stored(response_id, owner)
        signals = self.store if isinstance(self.store, CancelSignals) else None
        # It runs on another replica: the store carries the request there; wait for its end.
        if record.response.status in RUNNING and signals and await signals.request_cancel(response_id, owner):
            ended = await self._await_end(response_id, owner)
            if ended is not None and ended.response.status not in RUNNING:
                # Cancelled, or ended some other way while the request travelled.
                return ended.response
        status = record.response.status
        if status == S.RESPONSE_STATUS_CANCELLED:
            return record.response
        if status in RUNNING:
            raise _unreachable(response_id, "cancel_unreachable")
        raise _ended(response_id, status)

    async def control(self, response_id: str, control: pb.Control, owner: str = "") -> pb.ControlAccepted:
        """Deliver a control to a response in progress, here or on another replica; a small
        acknowledgement (never the whole response: a control must not cost a read of it)."""
        _require_id(response_id)
        check_control(control, self.limits.max_control_items)
        run = self.engine.runs.get(response_id, owner)
        if control.WhichOneof("control") == "cancel":
            response = await self.cancel(response_id, owner)
            return run.acknowledge() if run is not None else accepted(response)
        if run is not None:
            run.send(control)
            return run.acknowledge()
        record = await self._stored(response_id, owner)
        status = record.response.status
        if status not in RUNNING:
            raise _ended(response_id, status)
        if not isinstance(self.store, ControlSignals):
            raise _unreachable(response_id)
        rejected = await self.store.send_control(response_id, owner, control)
        if rejected is None:
            raise _unreachable(response_id)
        if rejected.code:
            raise rejected_error(rejected)
        if rejected.HasField("accepted"):
            return rejected.accepted
        # A replica of an earlier version accepted it (and so it still ran): its status as stored.
        return accepted(record.response)

    def deliver(self, response_id: str, control: pb.Control) -> pb.ControlRejected:
        """A control that came through the store from another replica (the owner was checked
        there): applied here; what the sender should answer."""
        run = self.engine.runs.get(response_id)
        if run is None:
            return rejection(_unreachable(response_id))
        try:
            run.send(control)
        except RequestError as err:
            return rejection(err)
        return pb.ControlRejected(accepted=run.acknowledge())

    async def _stored(self, response_id: str, owner: str) -> StoredResponse:
        record = await self.store.get(response_id, owner)
        if record is None:
            raise not_found("response", response_id, "response_id")
        return record

    async def _await_end(self, response_id: str, owner: str) -> StoredResponse | None:
        """The stored response once it has left the running statuses (or as it is at the timeout)."""
        delay, longest = CANCEL_POLL
        record = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CANCEL_WAIT):
                while True:
                    record = await self.store.get(response_id, owner)
                    if record is None or record.response.status not in RUNNING:
                        return record
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, longest)
        return record


def accepted(response: pb.Response) -> pb.ControlAccepted:
    return pb.ControlAccepted(response_id=response.id, status=response.status)


def rejection(err: RequestError) -> pb.ControlRejected:
    """A RequestError as the in-band message of a stream (and across replicas)."""
    return pb.ControlRejected(
        code=err.code.value[0],
        message=err.message,
        reason=err.reason,
        field_violations=[pb.FieldViolation(field=v.field, description=v.description) for v in err.violations],
    )


def rejected_error(rejected: pb.ControlRejected) -> RequestError:
    code = next((c for c in grpc.StatusCode if c.value[0] == rejected.code), grpc.StatusCode.UNKNOWN)
    violations = [FieldViolation(v.field, v.description) for v in rejected.field_violations]
    return RequestError(code, rejected.message, violations, rejected.reason)


def _require_id(response_id: str) -> None:
    violations = [FieldViolation("response_id", "required")] if not response_id else []
    check_id("response_id", response_id, violations)
    if violations:
        raise invalid_argument(violations)


def _unreachable(response_id: str, reason: str = "control_unreachable") -> RequestError:
    return RequestError(
        grpc.StatusCode.UNAVAILABLE,
        f"response {response_id!r} runs on another gateway replica that did not answer within {CANCEL_WAIT:.0f}s",
        reason=reason,
    )


def _ended(response_id: str, status: int) -> RequestError:
    return RequestError(
        grpc.StatusCode.FAILED_PRECONDITION,
        f"response {response_id!r} already ended with status {S.Name(status)}",
        [FieldViolation("response_id", "the response is not in progress")],
        "not_in_progress",
    )
