"""`--log-format json`: every log record as one JSON object a line, and the one line per finished
response (its id, who asked, model, status, turns, tool calls, tokens, duration, trace id) — never
message content."""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any

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


def configure(level: str, log_format: str = "text") -> None:
    """Like logging.basicConfig (a process that already has handlers keeps them), to stderr."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])


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
