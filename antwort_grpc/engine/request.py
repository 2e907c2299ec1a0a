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

# Optional settings a Response echoes under the request's own names, each only when it is set.
_SCALARS_IF_SET = ("max_output_tokens", "temperature", "top_p", "presence_penalty", "frequency_penalty", "top_logprobs")
_MESSAGES_IF_SET = ("tool_choice", "text")


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
    response.previous_response_id = request.previous_response_id
    response.conversation_id = request.conversation_id
    response.instructions = request.instructions
    response.parallel_tool_calls = request.parallel_tool_calls if request.HasField("parallel_tool_calls") else True
    response.store = request.store if request.HasField("store") else True
    if request.metadata:
        response.metadata.update(request.metadata)
    response.created_at.FromNanoseconds(time.time_ns())
    _echo_settings(request, response)
    return response


def _echo_settings(request: pb.CreateResponseRequest, response: pb.Response) -> None:
    """The optional settings the request set (unset stays unset), those passed to the backend as
    they are, and the tool-call limit, echoed."""
    for name in _SCALARS_IF_SET:
        if request.HasField(name):
            setattr(response, name, getattr(request, name))
    for name in _MESSAGES_IF_SET:
        if request.HasField(name):
            getattr(response, name).CopyFrom(getattr(request, name))
    if request.reasoning.effort:
        response.reasoning.effort = request.reasoning.effort
    response.prompt_cache_key = request.prompt_cache_key
    if request.limits.HasField("max_tool_calls"):
        response.max_tool_calls = request.limits.max_tool_calls
