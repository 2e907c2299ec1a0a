"""Pure pieces of the provider, table-tested: the SSE parser, the tool-call translator's edge
cases, Retry-After, base URLs and credentials."""

from __future__ import annotations

from pathlib import Path

import pytest

from antwort_grpc.config import GatewaySettings
from antwort_grpc.providers.base import ProviderError, ToolCallDelta
from antwort_grpc.providers.openai.config import BackendConfig, normalize_base_url
from antwort_grpc.providers.openai.errors import retry_after
from antwort_grpc.providers.openai.sse import SseParser
from antwort_grpc.providers.openai.translate import StreamTranslator
from antwort_grpc.providers.openai.wire import ChatCompletionChunk


def test_sse_events_split_across_reads_and_crlf_and_comments() -> None:
    parser = SseParser()
    assert parser.feed(b': ping\r\n\r\ndata: {"a"') == []
    assert parser.feed(b":1}\r\n\r\ndata: [DO") == [b'{"a":1}']
    assert parser.feed(b"NE]\n\nevent: x\ndata: one\ndata: two\n\n") == [b"[DONE]", b"one\ntwo"]
    assert parser.feed(b"data:tight") == []
    assert parser.finish() == [b"tight"]


def chunk(*tool_calls: str) -> ChatCompletionChunk:
    calls = ",".join(tool_calls)
    return ChatCompletionChunk.model_validate_json(f'{{"choices":[{{"delta":{{"tool_calls":[{calls}]}}}}]}}')


def test_a_call_without_an_id_gets_one_and_arguments_before_the_name_are_held() -> None:
    translator = StreamTranslator()
    assert translator.feed(chunk('{"index":0,"function":{"arguments":"{\\"a\\""}}')) == []
    [first] = translator.feed(chunk('{"index":0,"function":{"name":"f","arguments":":1}"}}'))
    assert isinstance(first, ToolCallDelta) and first.name == "f" and first.arguments == '{"a":1}'
    assert first.call_id is not None and first.call_id.startswith("call_")


def test_unindexed_calls_are_keyed_by_id_and_numbered_in_order() -> None:
    translator = StreamTranslator()
    events = translator.feed(
        chunk(
            '{"id":"a","function":{"name":"f","arguments":"{}"}}',
            '{"id":"b","function":{"name":"g","arguments":"{"}}',
        )
    )
    events += translator.feed(chunk('{"id":"b","function":{"arguments":"}"}}'))
    assert events == [
        ToolCallDelta(0, "{}", call_id="a", name="f"),
        ToolCallDelta(1, "{", call_id="b", name="g"),
        ToolCallDelta(1, "}"),
    ]


def test_backend_indexes_are_renumbered_from_zero() -> None:
    translator = StreamTranslator()
    [event] = translator.feed(chunk('{"index":3,"id":"x","function":{"name":"f","arguments":""}}'))
    assert event == ToolCallDelta(0, "", call_id="x", name="f")


def test_a_call_that_never_got_a_name_is_a_protocol_error() -> None:
    translator = StreamTranslator()
    translator.feed(chunk('{"index":0,"id":"x","function":{"arguments":"{}"}}'))
    with pytest.raises(ProviderError) as caught:
        translator.end()
    assert caught.value.code == "backend_protocol_error"


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({}, None),
        ({"retry-after": "3"}, 3.0),
        ({"retry-after": "0.5"}, 0.5),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:10 GMT"}, 10.0),
        ({"retry-after": "soon"}, None),
    ],
)
def test_retry_after(headers: dict[str, str], seconds: float | None) -> None:
    now = 1445412480.0  # 10 s before the date above
    assert retry_after(headers, now=now) == seconds


@pytest.mark.parametrize(
    ("given", "base"),
    [
        ("http://h:8000/v1", "http://h:8000/v1"),
        ("http://h:8000/v1/", "http://h:8000/v1"),
        ("http://h:8000/v1/chat/completions", "http://h:8000/v1"),
        ("http://h:11434", "http://h:11434/v1"),
        ("https://api.example.com/openai/v1", "https://api.example.com/openai/v1"),
    ],
)
def test_base_urls(given: str, base: str) -> None:
    assert normalize_base_url(given) == base


def test_the_api_key_comes_from_settings_or_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-file\n")
    monkeypatch.setenv("ANTWORT_BACKEND_URL", "http://h:1/v1")
    monkeypatch.setenv("ANTWORT_BACKEND_API_KEY_FILE", str(key_file))
    monkeypatch.setenv("ANTWORT_BACKEND_HEADERS", '{"X-Org": "o1"}')
    config = BackendConfig.from_settings(GatewaySettings())
    assert config.api_key == "sk-from-file" and config.headers == {"X-Org": "o1"}

    monkeypatch.setenv("ANTWORT_BACKEND_API_KEY", "sk-direct")
    assert BackendConfig.from_settings(GatewaySettings()).api_key == "sk-direct"
