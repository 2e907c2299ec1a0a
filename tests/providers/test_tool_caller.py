"""The scripted tool-calling model of `make run-tools` and the executors walkthrough: per-tool
arguments, the schema's required properties filled in, an answer from the last round's results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf.struct_pb2 import Struct

from antwort_grpc import pb
from antwort_grpc.providers.base import TurnRequest
from antwort_grpc.providers.scripted import Call, ScriptedProvider, ScriptError, Text, ToolCaller

ROOT = Path(__file__).resolve().parents[2]


def tool(name: str, schema: dict[str, object] | None = None) -> pb.FunctionTool:
    parameters = Struct()
    if schema is not None:
        parameters.update(schema)
        return pb.FunctionTool(name=name, parameters=parameters)
    return pb.FunctionTool(name=name)


def asked(*tools: pb.FunctionTool, items: list[pb.Item] | None = None) -> TurnRequest:
    user = pb.Item(message=pb.Message(role=pb.Role.ROLE_USER))
    return TurnRequest(model="", instructions="", items=items or [user], tools=list(tools))


def called(caller: ToolCaller, request: TurnRequest) -> dict[str, object]:
    [call] = [out for out in caller(request).outputs if isinstance(out, Call)]
    arguments: dict[str, object] = json.loads(call.arguments)
    return arguments


def test_the_walkthrough_script_gives_each_executor_tool_what_it_needs() -> None:
    [caller] = ScriptedProvider.from_file(ROOT / "examples" / "tool_caller.json").turns
    assert isinstance(caller, ToolCaller)
    code = tool("run_python", {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]})
    search = tool("search", {"type": "object", "properties": {"topic": {"type": "string"}}, "required": ["topic"]})
    assert called(caller, asked(code)) == {"code": "print(2 ** 100)"}
    assert called(caller, asked(search)) == {"topic": "timeouts"}
    assert called(caller, asked(tool("get_weather"))) == {"city": "Paris"}


def test_what_a_schema_requires_and_the_script_lacks_is_filled_by_type() -> None:
    caller = ToolCaller.of({"arguments": {"city": "Paris"}})
    properties = {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "hourly": {"type": ["boolean", "null"]},
        "note": {"type": "string"},
    }
    schema = {"type": "object", "properties": properties, "required": ["city", "days", "unit", "hourly"]}
    assert called(caller, asked(tool("forecast", schema))) == {
        "city": "Paris", "days": 1, "unit": "celsius", "hourly": True,
    }  # fmt: skip


def test_it_answers_with_every_result_of_the_last_round() -> None:
    def output(text: str) -> pb.Item:
        return pb.Item(function_call_output=pb.FunctionCallOutput(call_id="c", output=text))

    user = pb.Item(message=pb.Message(role=pb.Role.ROLE_USER))
    request = asked(tool("f"), items=[user, output("old"), user, output("a"), output("b")])
    assert ToolCaller()(request).outputs == [Text("The tool answered: a | b")]


def test_by_tool_entries_that_are_not_objects_are_a_script_error(tmp_path: Path) -> None:
    path = tmp_path / "caller.json"
    path.write_text(json.dumps({"tool_caller": {"by_tool": {"run_python": "print(1)"}}}))
    with pytest.raises(ScriptError, match="by_tool"):
        ScriptedProvider.from_file(path)
