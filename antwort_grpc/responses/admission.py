"""Before a response exists: what the before-response hooks get to see of its caller and request.
The engine asks them (with the first model call's hooks when it can, in the same exchange)."""

from __future__ import annotations

from antwort_grpc import pb
from antwort_grpc.hooks.dispatch import Dispatcher, HookRun
from antwort_grpc.hooks.service import Caller


def hook_run(
    hooks: Dispatcher | None, request: pb.CreateResponseRequest, caller: Caller | None, owner: str
) -> HookRun | None:
    """The hooks' side of the run (None without hooks). `caller` None: only the owner is known."""
    if hooks is None or not hooks.hooks:
        return None
    context = pb.HookContext(model=request.model, previous_response_id=request.previous_response_id)
    context.metadata.update(request.metadata)
    return HookRun(caller or Caller(owner=owner), context)
