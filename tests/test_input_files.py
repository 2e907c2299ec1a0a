"""Files sent inline as input, over both doors against a real gateway on the fake
OpenAI-compatible backend (which records what it received): a text file and a PDF reach the
model as their text, the stored input holds that text; a file by id or URL, a file the gateway
does not read, a PDF that is not one, and text past the request limit are refused naming the
part."""

from __future__ import annotations

import base64
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import grpc
import pytest

from antwort_grpc import pb
from antwort_grpc.providers.openai import BackendConfig, OpenAICompatProvider
from antwort_grpc.storage.memory import MemoryStore
from antwort_grpc.testing.fake_openai import FakeOpenAI, Reply
from tests.http_harness import Doors, running_doors

MODEL = "fake-model"


def minimal_pdf(text: str, lines: int = 1) -> bytes:
    """A one-page PDF showing `text` in Helvetica `lines` times, written by hand (no PDF writer
    needed); its content stream compressed, as PDFs have it (a small file, much text)."""
    shown = " ".join(f"({text}) Tj 0 -14 Td" for _ in range(lines))
    stream = zlib.compress(f"BT /F1 12 Tf 72 720 Td {shown} ET".encode())
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R"
        b" /Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for n, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % n + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def data_url(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64," + base64.b64encode(data).decode()


def with_file(**part: Any) -> list[dict[str, Any]]:
    content = [{"type": "input_text", "text": "Summarize."}, {"type": "input_file", **part}]
    return [{"role": "user", "content": content}]


@asynccontextmanager
async def doors(*replies: Reply, **gateway: Any) -> AsyncIterator[tuple[Doors, FakeOpenAI]]:
    async with FakeOpenAI(*replies) as fake:
        provider = OpenAICompatProvider(BackendConfig(base_url=fake.url, model=MODEL, max_retries=0))
        try:
            async with running_doors(provider=provider, store=MemoryStore(), model=MODEL, **gateway) as running:
                yield running, fake
        finally:
            await provider.aclose()


async def post(running: Doors, body: dict[str, Any]) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(running.url + "/v1/responses", json=body) as response,
    ):
        return response.status, await response.json()


def user_text(sent: dict[str, Any]) -> str:
    return str(sent["messages"][-1]["content"])


async def test_a_text_file_and_a_pdf_reach_the_model_as_their_text_over_http() -> None:
    notes = with_file(filename="notes.md", file_data=data_url("text/markdown", b"# Plan\nShip it."))
    report = with_file(filename="report.pdf", file_data=data_url("application/pdf", minimal_pdf("Revenue grew")))
    async with doors(Reply(text="ok"), Reply(text="ok")) as (running, fake):
        status, first = await post(running, {"model": MODEL, "input": notes})
        status_pdf, _ = await post(running, {"model": MODEL, "input": report})
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{running.url}/v1/responses/{first['id']}/input_items") as listed,
        ):
            stored = await listed.json()
    assert status == 200 and first["status"] == "completed", first
    assert status_pdf == 200
    assert user_text(fake.chat_requests[0]) == "Summarize.[file: notes.md]\n# Plan\nShip it."
    assert "[file: report.pdf]\nRevenue grew" in user_text(fake.chat_requests[1])
    parts = stored["data"][0]["content"]
    assert parts[1] == {"type": "input_text", "text": "[file: notes.md]\n# Plan\nShip it."}


async def test_a_file_is_read_over_grpc_too() -> None:
    file = pb.InputFile(filename="a.txt", file_data=b"plain words")
    part = pb.ContentPart(input_file=file)
    item = pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[part]))
    async with doors(Reply(text="ok")) as (running, fake):
        response = await running.grpc.create(pb.CreateResponseRequest(input_items=pb.ItemList(items=[item])))
    assert response.status == pb.ResponseStatus.RESPONSE_STATUS_COMPLETED
    assert user_text(fake.chat_requests[0]) == "[file: a.txt]\nplain words"


@pytest.mark.parametrize(
    ("part", "param", "words"),
    [
        ({"file_id": "file-abc123"}, "input[0].content[1].file_id", "send the file inline"),
        ({"file_url": "https://example.com/a.pdf"}, "input[0].content[1].file_url", "send the file inline"),
        ({"file_data": data_url("text/plain", b"x")}, "input[0].content[1].filename", "must be a string"),
        ({"filename": "a.txt", "file_data": "data:text/plain;base64,@@"}, "input[0].content[1].file_data", "base64"),
        (
            {"filename": "a.png", "file_data": data_url("image/png", b"\x89PNG")},
            "input[0].content[1].file_data",
            "text files and PDFs only",
        ),
        (
            {"filename": "a.pdf", "file_data": data_url("application/pdf", b"%PDF-1.4 garbage")},
            "input[0].content[1].file_data",
            "not a PDF",
        ),
        (
            {"filename": "a.txt", "file_data": data_url("text/plain", b"\xff\xfe")},
            "input[0].content[1].file_data",
            "not UTF-8",
        ),
    ],
)
async def test_a_file_the_gateway_cannot_read_is_a_400_naming_the_part(
    part: dict[str, Any], param: str, words: str
) -> None:
    async with doors() as (running, fake):
        status, body = await post(running, {"model": MODEL, "input": with_file(**part)})
    assert status == 400 and body["error"]["param"] == param, body
    assert words in body["error"]["message"]
    assert not fake.chat_requests


async def test_a_pdf_whose_text_is_past_the_request_limit_is_refused_over_both_doors() -> None:
    # A few hundred bytes of compressed PDF that hold some 20 kB of text.
    pdf = minimal_pdf("All work and no play makes a dull document", lines=500)
    async with doors(max_request_bytes=8192) as (running, fake):
        part = pb.ContentPart(input_file=pb.InputFile(filename="long.pdf", file_data=pdf))
        item = pb.Item(message=pb.Message(role=pb.Role.ROLE_USER, content=[part]))
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await running.grpc.create(pb.CreateResponseRequest(input_items=pb.ItemList(items=[item])))
        file = {"filename": "long.pdf", "file_data": data_url("application/pdf", pdf)}
        status, body = await post(running, {"model": MODEL, "input": with_file(**file)})
    assert len(pdf) < 2048
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "past the request limit of 8192 bytes" in (raised.value.details() or "")
    assert status == 400 and body["error"]["param"] == "input[0].content[1]", body
    assert not fake.chat_requests
