"""Before a response exists: the before-response hooks may refuse the request or change it."""

from __future__ import annotations

from collections.abc import Callable

import grpc

from antwort_grpc import pb
from antwort_grpc.errors import FieldViolation, RequestError
from antwort_grpc.hooks.dispatch import Dispatcher, HookFailed, HookRejected, HookRun
from antwort_grpc.hooks.service import Caller


async def admit(
    hooks: Dispatcher | None,
    request: pb.CreateResponseRequest,
    caller: Caller,
    validate: Callable[[pb.CreateResponseRequest], list[FieldViolation]],
) -> tuple[pb.CreateResponseRequest, HookRun | None]:
    """The request to run and the hooks' side of the run (None without hooks). A refusal is
    PERMISSION_DENIED with the hook's reason; a fail-closed hook failure is UNAVAILABLE with
    reason `hook_failed`. A request a hook returns must pass validation like the client's."""
    if hooks is None or not hooks.hooks:
        return request, None
    context = pb.HookContext(model=request.model, previous_response_id=request.previous_response_id)
    context.metadata.update(request.metadata)
    run = HookRun(caller, context)
    if not hooks.wants(pb.HookPoint.HOOK_POINT_BEFORE_RESPONSE):
        return request, run

    def problems(replaced: pb.CreateResponseRequest) -> list[str]:
        return [f"{v.field}: {v.description}" for v in validate(replaced)]

    try:
        request = await hooks.before_response(run, request, problems)
    except HookRejected as rejected:
        raise RequestError(grpc.StatusCode.PERMISSION_DENIED, str(rejected), reason="hook_rejected") from None
    except HookFailed as failed:
        raise RequestError(grpc.StatusCode.UNAVAILABLE, str(failed), reason="hook_failed") from None
    return request, run
