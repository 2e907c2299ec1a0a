"""`--log-format json`: every log record as one JSON object a line, and the one line per finished
response (its id, who asked, model, status, turns, tool calls, tokens, duration, trace id) — never
message content."""

from __future__ import annotations

import atexit
import datetime
import json
import logging
import os
import re
import sys
import threading
from typing import Any, TextIO

RESPONSE_LOGGER = "antwort_grpc.responses"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, separators=(",", ":"), default=str)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(level: str, log_format: str = "text", stream: TextIO | None = None) -> None:
    """Like logging.basicConfig (a process that already has handlers keeps them), to stderr."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter(log_format))
    logging.basicConfig(level=level.upper(), handlers=[handler])


def formatter(log_format: str) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)


def one_line(
    message: str, log_format: str, level: int = logging.INFO, logger: str = "antwort_grpc", **fields: Any
) -> str:
    """A line the process prints itself (on stdout, or its last words on stderr) in its log format."""
    record = logging.LogRecord(logger, level, "", 0, message, None, None)
    record.fields = fields
    return formatter(log_format).format(record) if log_format == "json" else message


# A line of grpcio's C core: severity, date, time, thread, source file:line, then the message.
_NATIVE = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ ([^\]\s]+)\] (.*)$")
_NATIVE_LEVELS = {"I": logging.INFO, "W": logging.WARNING, "E": logging.ERROR, "F": logging.CRITICAL}
NATIVE_LOGGER = "grpc"
OTHER_LOGGER = "stderr"


def log_native_line(line: str) -> None:
    """One line written to file descriptor 2 by native code (or anything bypassing logging)."""
    if not line.strip():
        return
    found = _NATIVE.match(line)
    if found is None:
        logging.getLogger(OTHER_LOGGER).warning("%s", line)
        return
    severity, source, message = found.groups()
    logging.getLogger(NATIVE_LOGGER).log(_NATIVE_LEVELS[severity], "%s", message, extra={"fields": {"source": source}})


class NativeStderr:
    """grpcio's C core writes its own lines (a failed TLS handshake, say) straight to file
    descriptor 2, in a format of its own. While this is open, descriptor 2 is a pipe whose lines a
    thread passes through `logging`, whose handler writes to the real stderr (`stream`): every
    line on stderr is in the gateway's log format, JSON included. Child processes inherit the pipe,
    so their lines are formatted too."""

    def __init__(self) -> None:
        self._saved = os.dup(2)
        self.stream: TextIO = os.fdopen(os.dup(self._saved), "w", buffering=1, encoding="utf-8", errors="replace")
        read, write = os.pipe()
        os.dup2(write, 2)
        os.close(write)
        self._thread = threading.Thread(target=self._pump, args=(read,), name="native-stderr", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def _pump(self, read: int) -> None:
        with os.fdopen(read, "r", encoding="utf-8", errors="replace") as lines:
            for line in lines:
                log_native_line(line.rstrip("\n"))

    def close(self) -> None:
        """Descriptor 2 is the real stderr again; the lines still in the pipe are logged first."""
        if self._saved < 0:
            return
        sys.stderr.flush()
        os.dup2(self._saved, 2)  # the pipe's last writer here is gone: the thread reads to its end
        os.close(self._saved)
        self._saved = -1
        self._thread.join(timeout=2)


_native: NativeStderr | None = None


def route_native_stderr() -> TextIO:
    """Route descriptor 2 through logging (NativeStderr); the real stderr, for the log handler."""
    global _native
    if _native is None:
        _native = NativeStderr()
    return _native.stream


def real_stderr() -> int:
    """The descriptor of the real stderr (not NativeStderr's pipe): where a child process that
    formats its own lines writes them."""
    return _native.stream.fileno() if _native is not None else 2


def restore_native_stderr() -> None:
    if _native is not None:
        _native.close()


def response_line(fields: dict[str, Any]) -> None:
    """One record per finished response; the text form says it in a sentence, JSON has the fields."""
    logging.getLogger(RESPONSE_LOGGER).info(
        "response %s %s: %d turns, %d tool calls, %d+%d tokens, %.0f ms",
        fields["response_id"],
        fields["status"],
        fields["turns"],
        fields["tool_calls"],
        fields["input_tokens"],
        fields["output_tokens"],
        fields["duration_ms"],
        extra={"fields": fields},
    )
