"""The lifecycle events (`created`, `in_progress`, the terminal one) each carry the whole Response,
every tool schema of the request echoed: the emitter serializes it once per lifecycle point, makes
the events from those bytes, and hands the bytes to the writer, rather than copying the Response
into each event and serializing every copy again."""

from __future__ import annotations

from typing import Any

from antwort_grpc import pb
from antwort_grpc.engine.emitter import ResponseEmitter, echoed_tools
from antwort_grpc.engine.request import input_items, new_response
from antwort_grpc.server.decode import EventMessage
from tests.harness import assert_valid_stream

Status = pb.ResponseStatus


def _response() -> pb.Response:
    response = pb.Response(id="resp_1", model="m", status=Status.RESPONSE_STATUS_IN_PROGRESS, instructions="be brief")
    response.created_at.seconds = 1
    response.metadata["team"] = "blue"
    response.tool_choice.mode = pb.ToolChoiceMode.TOOL_CHOICE_MODE_AUTO
    response.temperature, response.parallel_tool_calls, response.store = 0.5, True, True
    for n in range(3):
        tool = response.tools.add()
        tool.function.name = f"tool_{n}"
        tool.function.parameters.update({"type": "object", "properties": {f"p{n}": {"type": "string"}}})
    return response


class _CountingTool:
    """A Tool (unit stand-in) that counts how often it is serialized."""

    def __init__(self, tool: pb.Tool) -> None:
        self.real = tool
        self.serialized = 0

    def SerializeToString(self) -> bytes:
        self.serialized += 1
        return self.real.SerializeToString()


class _CountingResponse:
    """A Response (unit stand-in) whose tools count their serializations; one that is copied or
    serialized whole fails (it is no protobuf message)."""

    def __init__(self, response: pb.Response) -> None:
        self.real = response
        self.tools = [_CountingTool(tool) for tool in response.tools]

    def SerializeToString(self) -> bytes:
        raise AssertionError("the whole Response, its tools with it, was serialized")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_created_and_in_progress_are_made_from_one_serialization_of_the_response() -> None:
    real = _response()
    counting = _CountingResponse(real)
    emitter = ResponseEmitter(counting)  # type: ignore[arg-type]

    created, in_progress = emitter.opening()

    assert [tool.serialized for tool in counting.tools] == [1, 1, 1]
    assert created.created.response == real
    assert in_progress.in_progress.response == real
    assert (created.sequence_number, in_progress.sequence_number) == (1, 2)


def test_the_echoed_tools_are_serialized_once_for_every_lifecycle_event_and_its_writing() -> None:
    real = _response()
    counting = _CountingResponse(real)
    emitter = ResponseEmitter(counting)  # type: ignore[arg-type]
    events = list(emitter.opening())
    events += emitter.on_text("hello")
    events += emitter.close_turn()
    real.status = Status.RESPONSE_STATUS_COMPLETED
    real.usage.input_tokens = 3
    real.completed_at.seconds = 2
    events.append(emitter.terminal())

    written = [EventMessage(event, emitter.take_wire(event)).SerializeToString() for event in events]

    assert [tool.serialized for tool in counting.tools] == [1, 1, 1]
    assert [pb.CreateResponseResponse.FromString(data).event for data in written] == events
    assert_valid_stream(events)
    assert events[-1].completed.response == real
    assert events[-1].completed.response.output[0].message.content[0].output_text.text == "hello"


def test_a_lifecycle_events_bytes_are_taken_once_and_only_for_that_event() -> None:
    emitter = ResponseEmitter(_response())
    created, in_progress = emitter.opening()
    delta = emitter.on_text("hi")[-1]

    assert emitter.take_wire(delta) is None
    wire = emitter.take_wire(in_progress)
    assert wire is not None and pb.StreamEvent.FromString(wire) == in_progress
    assert emitter.take_wire(in_progress) is None
    wire = emitter.take_wire(created)
    assert wire is not None and pb.StreamEvent.FromString(wire) == created
    assert emitter.take_wire(pb.StreamEvent.FromString(wire)) is None


def test_a_response_that_requires_action_ends_with_its_calls_and_approvals_after_the_response() -> None:
    response = _response()
    emitter = ResponseEmitter(response)
    events = list(emitter.opening())
    events += emitter.on_tool_call(0, "call_1", "tool_0", '{"p0": "x"}')
    events += emitter.close_turn()
    response.status = Status.RESPONSE_STATUS_REQUIRES_ACTION
    calls = [pb.FunctionCall(call_id="call_1", name="tool_0", arguments='{"p0": "x"}')]
    approvals = [pb.ApprovalRequest(call_id="call_2", name="tool_1", arguments="{}")]
    terminal = emitter.terminal(calls, approvals)
    events.append(terminal)

    assert_valid_stream(events)
    action = terminal.requires_action
    assert action.response == response
    assert list(action.tool_calls) == calls
    assert list(action.approval_requests) == approvals
    wire = emitter.take_wire(terminal)
    assert wire is not None and pb.StreamEvent.FromString(wire) == terminal


def test_every_final_status_has_its_own_terminal_event() -> None:
    kinds = {
        Status.RESPONSE_STATUS_COMPLETED: "completed",
        Status.RESPONSE_STATUS_REQUIRES_ACTION: "requires_action",
        Status.RESPONSE_STATUS_INCOMPLETE: "incomplete",
        Status.RESPONSE_STATUS_CANCELLED: "cancelled",
        Status.RESPONSE_STATUS_FAILED: "failed",
    }
    for status, kind in kinds.items():
        for response in (_response(), pb.Response(id="resp_2", model="m")):
            response.status = status
            event = ResponseEmitter(response).terminal([pb.FunctionCall(call_id="call_1", name="f")])
            assert event.WhichOneof("event") == kind
            assert getattr(event, kind).response == response
            if kind == "requires_action":
                assert [call.call_id for call in event.requires_action.tool_calls] == ["call_1"]


def test_input_items_are_copies_with_ids_and_the_request_keeps_its_own() -> None:
    request = pb.CreateResponseRequest()
    given = request.input_items.items.add()
    given.message.role = pb.Role.ROLE_USER
    given.message.content.add().input_text.text = "hello"
    named = request.input_items.items.add()
    named.id, named.status = "msg_given", pb.ItemStatus.ITEM_STATUS_INCOMPLETE
    named.message.content.add().input_text.text = "again"

    items = input_items(request)
    items[0].message.content[0].input_text.text = "changed"

    assert items[0].id.startswith("msg_") and items[0].status == pb.ItemStatus.ITEM_STATUS_COMPLETED
    assert (items[1].id, items[1].status) == ("msg_given", pb.ItemStatus.ITEM_STATUS_INCOMPLETE)
    assert request.input_items.items[0].id == ""
    assert request.input_items.items[0].message.content[0].input_text.text == "hello"


def _request_with_tools() -> pb.CreateResponseRequest:
    request = pb.CreateResponseRequest(model="m", instructions="be brief", input_text="hi")
    request.tools.extend(_response().tools)
    request.metadata["team"] = "blue"
    request.temperature = 0.5
    return request


def test_a_completed_response_ends_with_the_event_it_was_built_in() -> None:
    request = _request_with_tools()
    ending = pb.StreamEvent()
    tools = echoed_tools(request.tools)
    response = new_response(request, "m", within=ending, tools=tools)
    emitter = ResponseEmitter(response, ending, tools)
    events = list(emitter.opening())
    events += emitter.on_text("hello")
    events += emitter.close_turn()
    response.status = Status.RESPONSE_STATUS_COMPLETED

    terminal = emitter.terminal()
    events.append(terminal)

    assert terminal is ending
    assert terminal.sequence_number == len(events)
    assert_valid_stream(events)
    assert terminal.completed.response == response
    assert [t.function.name for t in terminal.completed.response.tools] == ["tool_0", "tool_1", "tool_2"]
    # The opening events are snapshots: the answer is only in the terminal one.
    assert not events[0].created.response.output
    wire = emitter.take_wire(terminal)
    assert wire is not None and pb.StreamEvent.FromString(wire) == terminal


def test_a_response_that_does_not_complete_ends_with_an_event_of_its_own() -> None:
    request = _request_with_tools()
    ending = pb.StreamEvent()
    response = new_response(request, "m", within=ending)
    emitter = ResponseEmitter(response, ending)
    emitter.opening()
    response.status = Status.RESPONSE_STATUS_INCOMPLETE

    terminal = emitter.terminal()

    assert terminal is not ending
    assert terminal.incomplete.response == response


def test_a_response_built_in_an_event_echoes_the_request_as_one_built_alone() -> None:
    request = _request_with_tools()
    ending = pb.StreamEvent()
    within = new_response(request, "m", within=ending, tools=echoed_tools(request.tools))
    alone = new_response(request, "m")
    alone.id, alone.created_at.seconds, alone.created_at.nanos = (
        within.id,
        within.created_at.seconds,
        within.created_at.nanos,
    )

    assert within == alone
    assert alone == pb.Response(
        id=within.id,
        model="m",
        status=Status.RESPONSE_STATUS_IN_PROGRESS,
        instructions="be brief",
        tools=request.tools,
        parallel_tool_calls=True,
        store=True,
        metadata={"team": "blue"},
        temperature=0.5,
        created_at=within.created_at,
    )
