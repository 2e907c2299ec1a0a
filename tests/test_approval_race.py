"""A decision sent the moment approval_requested is out is accepted: the calls wait from the event
on, not from when the run next looks at its inbox (a client approving everything at once hit this)."""

from __future__ import annotations

from antwort_grpc import pb
from antwort_grpc.engine import Engine, EngineConfig
from antwort_grpc.executors.base import FunctionExecutor
from antwort_grpc.providers.scripted import Call, ScriptedProvider
from antwort_grpc.storage.memory import MemoryStore
from tests.harness import function_tool, user


async def test_an_approval_sent_as_soon_as_it_is_requested_is_accepted() -> None:
    provider = ScriptedProvider([[Call.of("send_mail", {"to": "x"}, call_id="m")]])
    engine = Engine(provider, MemoryStore(), EngineConfig(executors=[FunctionExecutor()]))
    request = user("mail x")
    tool = function_tool("send_mail", to="string")
    tool.require_approval.mode = pb.ApprovalMode.APPROVAL_MODE_ALWAYS
    request.tools.append(tool)
    request.model = "m"
    run = await engine.start(request, controller=True)
    kinds = []
    async for event in run.events():
        kinds.append(event.WhichOneof("event"))
        if kinds[-1] == "approval_requested":
            # Before the run's generator resumes: as when the client answers at once.
            run.send(pb.Control(approval=pb.ApprovalResponse(call_id="m", approve=True)))
    assert kinds[-1] == "requires_action"
    assert "approval_requested" in kinds
