"""Conversation state: rebuild a request's context from the chain of earlier responses."""

from __future__ import annotations

import grpc

from antwort_grpc import pb
from antwort_grpc.errors import FieldViolation, RequestError, not_found
from antwort_grpc.storage.base import ResponseStore, StoredResponse


async def load_history(store: ResponseStore, previous_id: str, *, owner: str, max_depth: int) -> list[pb.Item]:
    """The earlier input and output of every response in the chain, oldest first.

    Raises NOT_FOUND for a missing link, FAILED_PRECONDITION for a response that is still running,
    a cycle, or a chain longer than `max_depth`.
    """
    chain: list[StoredResponse] = []
    seen: set[str] = set()
    current = previous_id
    while current:
        if current in seen:
            raise _precondition(f"previous_response_id chain has a cycle at {current!r}")
        if len(chain) >= max_depth:
            raise _precondition(f"previous_response_id chain is longer than {max_depth} responses")
        record = await store.get(current, owner)
        if record is None:
            if current == previous_id:
                raise not_found("response", current, "previous_response_id")
            raise not_found("response (earlier in the previous_response_id chain)", current, "previous_response_id")
        if current == previous_id and record.response.status in (
            pb.ResponseStatus.RESPONSE_STATUS_IN_PROGRESS,
            pb.ResponseStatus.RESPONSE_STATUS_QUEUED,
        ):
            raise _precondition(f"response {current!r} is still in progress")
        chain.append(record)
        seen.add(current)
        current = record.response.previous_response_id
    items: list[pb.Item] = []
    for record in reversed(chain):
        items += record.input_items
        items += record.response.output
    return items


def _precondition(message: str) -> RequestError:
    return RequestError(
        grpc.StatusCode.FAILED_PRECONDITION,
        message,
        [FieldViolation("previous_response_id", message)],
        "invalid_previous_response",
    )


def unanswered_calls(items: list[pb.Item]) -> list[pb.Item]:
    """function_call items with no function_call_output anywhere after them, in order."""
    answered = {i.function_call_output.call_id for i in items if i.WhichOneof("kind") == "function_call_output"}
    return [i for i in items if i.WhichOneof("kind") == "function_call" and i.function_call.call_id not in answered]
