"""Request translation: TurnRequest -> chat-completions body (a pure function, table-tested), and
one check that the body really goes over the wire."""

from __future__ import annotations

from typing import Any

import pytest

from antwort_grpc import pb
from antwort_grpc.providers.base import TurnRequest
from antwort_grpc.providers.openai import OpenAICompatProvider
from antwort_grpc.providers.openai.request import build_body, tool_choice
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply

from .turns import drain, user

M = pb.ToolChoiceMode


def message(role: pb.Role.ValueType, *parts: pb.ContentPart) -> pb.Item:
    return pb.Item(message=pb.Message(role=role, content=list(parts)))


def text(value: str) -> pb.ContentPart:
    return pb.ContentPart(input_text=pb.InputText(text=value))


def out_text(value: str) -> pb.ContentPart:
    return pb.ContentPart(output_text=pb.OutputText(text=value))


def call(call_id: str, name: str, arguments: str = "{}") -> pb.Item:
    return pb.Item(function_call=pb.FunctionCall(call_id=call_id, name=name, arguments=arguments))


def result(call_id: str, output: str) -> pb.Item:
    return pb.Item(function_call_output=pb.FunctionCallOutput(call_id=call_id, output=output))


def weather_tool() -> pb.FunctionTool:
    tool = pb.FunctionTool(name="get_weather", description="Weather for a city", strict=True)
    tool.parameters.update({"type": "object", "properties": {"city": {"type": "string"}}})
    return tool


def body_of(**fields: Any) -> dict[str, Any]:
    fields.setdefault("model", "m")
    fields.setdefault("instructions", "")
    fields.setdefault("items", [])
    fields.setdefault("tools", [])
    return build_body(TurnRequest(**fields), stream=False)


def test_instructions_become_a_leading_system_message() -> None:
    body = body_of(instructions="Be brief.", items=[user("Hi")])
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def test_message_roles_and_text_parts_become_chat_messages() -> None:
    items = [
        message(pb.Role.ROLE_DEVELOPER, text("Rules.")),
        message(pb.Role.ROLE_USER, text("Part one. "), text("Part two.")),
        message(pb.Role.ROLE_ASSISTANT, out_text("Answer.")),
    ]
    assert body_of(items=items)["messages"] == [
        {"role": "system", "content": "Rules."},
        {"role": "user", "content": "Part one. Part two."},
        {"role": "assistant", "content": "Answer."},
    ]


def test_images_become_image_url_parts() -> None:
    image = pb.ContentPart(
        input_image=pb.InputImage(image_url="data:image/png;base64,AAAA", detail=pb.ImageDetail.IMAGE_DETAIL_LOW)
    )
    [msg] = body_of(items=[message(pb.Role.ROLE_USER, text("What is this?"), image)])["messages"]
    assert msg == {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
        ],
    }


def test_function_calls_become_one_assistant_message_and_outputs_tool_messages() -> None:
    items = [
        user("Weather in Paris and Rome?"),
        message(pb.Role.ROLE_ASSISTANT, out_text("Checking both.")),
        call("c1", "get_weather", '{"city":"Paris"}'),
        call("c2", "get_weather", '{"city":"Rome"}'),
        result("c1", "sunny"),
        result("c2", "rain"),
        pb.Item(reasoning=pb.Reasoning(text="internal")),
    ]
    messages = body_of(items=items)["messages"]
    assert messages[1:] == [
        {
            "role": "assistant",
            "content": "Checking both.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
                {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
    ]


def test_a_call_without_preceding_text_is_an_assistant_message_without_content() -> None:
    messages = body_of(items=[user("x"), call("c1", "f")])["messages"]
    assert messages[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }


def test_a_call_cut_mid_arguments_goes_back_to_the_backend_with_json_arguments() -> None:
    """A steering message cut the model while it wrote `{"cit`: the stored call keeps that text,
    the backend gets JSON (it parses the history) next to the call's error output."""
    items = [user("Weather?"), call("c1", "get_weather", '{"cit'), result("c1", "superseded"), user("Rome")]
    messages = body_of(items=items)["messages"]
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert body_of(items=[user("x"), call("c1", "f", "")])["messages"][1]["tool_calls"][0]["function"] == {
        "name": "f",
        "arguments": "{}",
    }
    assert items[1].function_call.arguments == '{"cit', "the stored item is not changed"


def test_tools_become_function_definitions_with_parallel_tool_calls() -> None:
    bare = pb.FunctionTool(name="now")
    body = body_of(tools=[weather_tool(), bare], parallel_tool_calls=False)
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                "strict": True,
            },
        },
        {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
    ]
    assert body["parallel_tool_calls"] is False
    assert "tool_choice" not in body


def test_without_tools_no_tool_fields_are_sent() -> None:
    body = body_of(tool_choice=pb.ToolChoice(mode=M.TOOL_CHOICE_MODE_REQUIRED))
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & body.keys()


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        (pb.ToolChoice(mode=M.TOOL_CHOICE_MODE_AUTO), "auto"),
        (pb.ToolChoice(mode=M.TOOL_CHOICE_MODE_REQUIRED), "required"),
        (pb.ToolChoice(mode=M.TOOL_CHOICE_MODE_NONE), "none"),
        (pb.ToolChoice(function=pb.NamedToolChoice(name="get_weather")),
         {"type": "function", "function": {"name": "get_weather"}}),
        # allowed_tools: the model sees all tools; only the mode travels, the engine enforces the list.
        (pb.ToolChoice(allowed_tools=pb.AllowedTools(mode=M.TOOL_CHOICE_MODE_REQUIRED, tool_names=["a"])),
         "required"),
        (pb.ToolChoice(allowed_tools=pb.AllowedTools(tool_names=["a"])), "auto"),
    ],
)  # fmt: skip
def test_tool_choice(choice: pb.ToolChoice, wire: object) -> None:
    assert tool_choice(choice) == wire
    assert body_of(tools=[weather_tool()], tool_choice=choice)["tool_choice"] == wire


def test_sampling_settings_are_sent_only_when_set() -> None:
    assert not {"max_tokens", "temperature", "top_p"} & body_of().keys()
    body = body_of(max_output_tokens=64, temperature=0.2, top_p=0.9)
    assert (body["max_tokens"], body["temperature"], body["top_p"]) == (64, 0.2, 0.9)


def test_streaming_always_asks_for_usage() -> None:
    body = build_body(TurnRequest(model="m", instructions="", items=[], tools=[]), stream=True)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


async def test_the_body_goes_over_the_wire_with_credentials_and_extra_headers(
    fake: FakeOpenAI, make_provider: Any
) -> None:
    provider: OpenAICompatProvider = make_provider(fake.url, api_key="sk-test", headers={"X-Tenant": "t1"})
    fake.add(Reply(text="ok"))
    request = TurnRequest(
        model="", instructions="Be brief.", items=[user("Hi")], tools=[weather_tool()], temperature=0.5
    )

    await drain(provider, request)

    [received] = fake.requests
    assert received.headers["Authorization"] == "Bearer sk-test"
    assert received.headers["X-Tenant"] == "t1"
    # A turn without a model uses the configured one.
    assert received.body["model"] == "fake-model"
    assert received.body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert received.body["tools"][0]["function"]["name"] == "get_weather"
    assert received.body["temperature"] == 0.5
