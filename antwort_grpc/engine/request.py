"""Turning a CreateResponseRequest into the pieces the loop works with."""

from __future__ import annotations

import time

from antwort_grpc import pb
from antwort_grpc.ids import new_id, response_id

# Plain ints: enum attribute lookups are Python-level calls, and these are read on every request.
_COMPLETED: int = pb.ItemStatus.ITEM_STATUS_COMPLETED
_USER: int = pb.Role.ROLE_USER
_IN_PROGRESS: int = pb.ResponseStatus.RESPONSE_STATUS_IN_PROGRESS

_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
    "approval_response": "apres",
}

# What a Response echoes under the request's own names, each only when the request set it.
_ECHOED = frozenset(
    {
        "previous_response_id",
        "conversation_id",
        "instructions",
        "parallel_tool_calls",
        "store",
        "max_output_tokens",
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
        "top_logprobs",
        "prompt_cache_key",
    }
)
_ECHOED_MESSAGES = frozenset({"tool_choice", "text"})


def input_items(request: pb.CreateResponseRequest) -> list[pb.Item]:
    """The request's input as items with ids; a plain string becomes one user message."""
    if request.WhichOneof("input") == "input_text":
        part = pb.ContentPart(input_text=pb.InputText(text=request.input_text))
        item = pb.Item(
            id=new_id("msg"),
            status=_COMPLETED,  # type: ignore[arg-type]
            message=pb.Message(role=_USER, content=[part]),  # type: ignore[arg-type]
        )
        return [item]
    # One copy of the whole list (a single call into C): an 8 MB request's 2,048 items copied
    # one by one cost four times as much, on the event loop.
    copied = type(request.input_items)()
    copied.CopyFrom(request.input_items)
    items = list(copied.items)
    for item in items:
        if not item.id:
            item.id = new_id(_PREFIX.get(item.WhichOneof("kind") or "message", "item"))
        if not item.status:
            item.status = _COMPLETED  # type: ignore[assignment]
    return items


def new_response(
    request: pb.CreateResponseRequest, model: str, within: pb.StreamEvent | None = None, tools: bytes = b""
) -> pb.Response:
    """A Response in progress, echoing the request's settings (as the Responses API does).

    `within`: the event to build it in, as its `completed` (the terminal event of a response that
    completes then needs no copy of it). `tools`: the request's tools as `echoed_tools` gives them.
    """
    response = within.completed.response if within is not None else pb.Response()
    if tools:
        response.MergeFromString(tools)
    elif request.tools:
        response.tools.extend(request.tools)
    response.id = response_id()
    response.model = model
    response.status = _IN_PROGRESS  # type: ignore[assignment]
    response.parallel_tool_calls = True
    response.store = True
    response.created_at.FromNanoseconds(time.time_ns())
    # What the request set of what a Response echoes (unset stays unset, or its default): the
    # settings, those passed to the backend as they are, and the tool-call limit. One pass over the
    # fields set (a single call into C): a plain request sets three or four of them, and asking
    # after each echoed one by name cost as much as the rest of the Response.
    for field, value in request.ListFields():
        name = field.name
        if name in _ECHOED:
            setattr(response, name, value)
        elif name in _ECHOED_MESSAGES:
            getattr(response, name).CopyFrom(value)
        elif name == "metadata":
            response.metadata.update(value)
        elif name == "reasoning" and value.effort:
            response.reasoning.effort = value.effort
        elif name == "limits" and value.HasField("max_tool_calls"):
            response.max_tool_calls = value.max_tool_calls
    return response
