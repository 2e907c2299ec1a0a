"""Files sent inline with a request, read as text before the response starts.

A backend behind the gateway takes text and images only (Chat Completions has no common file
part), so a file becomes the text it holds, once, at intake: a text file its UTF-8 text, a PDF
the text of its pages (pypdf, in the worker thread: a large PDF is seconds of CPU). The stored
input holds that text, headed by the file's name. Anything else, a file that is not what it
says, or text past the request limit, is INVALID_ARGUMENT naming the part.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

from antwort_grpc import pb
from antwort_grpc.errors import FieldViolation, invalid_argument
from antwort_grpc.offload import off_loop

_TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/xml",
        "application/yaml",
        "application/x-yaml",
        "application/csv",
        "application/javascript",
        "application/x-ndjson",
        "application/toml",
        "application/sql",
    }
)
_TEXT_EXTENSIONS = frozenset(
    {
        "txt", "md", "markdown", "rst", "csv", "tsv", "json", "jsonl", "ndjson", "xml", "html", "htm",
        "yaml", "yml", "toml", "ini", "cfg", "conf", "log", "py", "js", "ts", "java", "go", "rs", "c",
        "h", "cpp", "hpp", "cs", "rb", "php", "sh", "sql", "tex", "css", "proto",
    }
)  # fmt: skip
PDF = "application/pdf"


def file_parts(request: pb.CreateResponseRequest) -> Iterator[tuple[str, pb.ContentPart]]:
    """The request's file parts, each with its field path."""
    if request.WhichOneof("input") != "input_items":
        return
    for n, item in enumerate(request.input_items.items):
        if item.WhichOneof("kind") != "message":
            continue
        for m, part in enumerate(item.message.content):
            if part.WhichOneof("part") == "input_file":
                yield f"input_items.items[{n}].message.content[{m}].input_file", part


def has_files(request: pb.CreateResponseRequest) -> bool:
    return next(file_parts(request), None) is not None


async def read_files(request: pb.CreateResponseRequest, max_text_bytes: int) -> pb.CreateResponseRequest:
    """A copy of `request` with every file part replaced by the text it holds; their text together
    at most `max_text_bytes` (0: no bound)."""
    return await off_loop(_read_all, request, max_text_bytes)


def _read_all(request: pb.CreateResponseRequest, max_text_bytes: int) -> pb.CreateResponseRequest:
    read = pb.CreateResponseRequest()
    read.CopyFrom(request)
    total = 0
    for at, part in list(file_parts(read)):
        text = f"[file: {part.input_file.filename}]\n" + file_text(part.input_file, at)
        total += len(text.encode())
        if 0 < max_text_bytes < total:  # 0: no limit but the message limit
            raise invalid_argument(
                [FieldViolation(at, f"the files' text is past the request limit of {max_text_bytes} bytes")]
            )
        part.Clear()
        part.input_text.text = text
    return read


def file_text(file: pb.InputFile, at: str) -> str:
    """The text `file` holds; INVALID_ARGUMENT naming `at` when it holds none the gateway reads."""
    if not file.filename:
        raise invalid_argument([FieldViolation(f"{at}.filename", "required: the file's name")])
    kind = file.media_type.lower().split(";")[0].strip()
    extension = file.filename.rsplit(".", 1)[-1].lower() if "." in file.filename else ""
    if kind == PDF or extension == "pdf" or file.file_data.startswith(b"%PDF-"):
        return _pdf_text(file.file_data, at)
    if kind.startswith("text/") or kind in _TEXT_TYPES or extension in _TEXT_EXTENSIONS:
        try:
            return file.file_data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise invalid_argument(
                [FieldViolation(f"{at}.file_data", f"not UTF-8 text (byte {err.start}): text files are read as UTF-8")]
            ) from None
    what = kind or (f".{extension}" if extension else "a file without an extension")
    raise invalid_argument([FieldViolation(f"{at}.file_data", f"{what} is not read: text files and PDFs only")])


def _pdf_text(data: bytes, at: str) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    # pypdf logs every oddity of a damaged file; the answer is the error below.
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise invalid_argument([FieldViolation(f"{at}.file_data", "an encrypted PDF: send it decrypted")])
        pages = [page.extract_text() or "" for page in reader.pages]
    except (PdfReadError, ValueError, KeyError, TypeError) as err:
        raise invalid_argument([FieldViolation(f"{at}.file_data", f"not a PDF pypdf can read ({err})")]) from None
    return "\n\n".join(text.strip() for text in pages).strip()
