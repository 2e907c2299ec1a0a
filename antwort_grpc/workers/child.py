"""A worker process of `serve --workers N`: one gateway (gateway.serve) on the shared ports.

Its parent writes one JSON line to its stdin — the settings, its index, the worker count and
the embedded model's URL — and keeps stdin open while it lives. The worker answers with one JSON
line on stdout once it serves. When stdin closes (the parent died, kill -9 included), the worker
shuts down as on SIGTERM.

Entry point: `python -m antwort_grpc.workers.child`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from typing import Any

from antwort_grpc import event_loop, machine
from antwort_grpc.config import GatewaySettings, WorkerPlace
from antwort_grpc.gateway import Gateway, serve
from antwort_grpc.observability.logs import (
    TEXT_FORMAT,
    configure,
    one_line,
    restore_native_stderr,
    route_native_stderr,
)
from antwort_grpc.startup_errors import describe


class WorkerTag(logging.Filter):
    """Every record says which worker wrote it (the `worker` field of a JSON line)."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def filter(self, record: logging.LogRecord) -> bool:
        fields = getattr(record, "fields", None)
        record.fields = {**fields, "worker": self.index} if isinstance(fields, dict) else {"worker": self.index}
        return True


def _logging(settings: GatewaySettings, index: int) -> None:
    configure(settings.log_level, settings.log_format, route_native_stderr())
    for handler in logging.getLogger().handlers:
        handler.addFilter(WorkerTag(index))
        if settings.log_format == "text":
            handler.setFormatter(logging.Formatter(TEXT_FORMAT.replace("%(name)s", f"[worker {index}] %(name)s")))


def _watch_parent() -> None:
    """SIGTERM to this process once stdin closes: the parent is gone."""

    def wait() -> None:
        # Unbuffered: a thread blocked in sys.stdin's reader would hold its lock at exit.
        while os.read(0, 4096):
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait, name="parent-watch", daemon=True).start()


def _first_line() -> bytes:
    """The parent's one line, read without a buffer (nothing after it is read here)."""
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(0, 1)
        if not chunk:
            break
        line += chunk
    return line or b"null"


def _announce(gateway: Gateway) -> None:
    print(json.dumps({"pid": os.getpid(), "metrics_port": gateway.metrics_port}), flush=True)


def settings_of(spec: dict[str, Any]) -> GatewaySettings:
    settings = GatewaySettings(**spec["settings"])
    settings.place_worker(WorkerPlace(spec["index"], spec["count"], spec.get("model_url")))
    return settings


def main() -> int:
    spec = json.loads(_first_line())
    if not isinstance(spec, dict):
        print("antwort_grpc.workers.child is started by `antwort-grpc serve --workers N`", file=sys.stderr)
        return 2
    settings = settings_of(spec)
    place = settings.worker
    assert place is not None
    machine.share(place.count)
    _logging(settings, place.index)
    _watch_parent()
    try:
        # Workers start no process of their own (the parent started the model): the default loop.
        event_loop.run(serve(settings, _announce))
    except KeyboardInterrupt:
        return 130  # Ctrl-C, forwarded by the parent, before this worker served: nothing to drain
    except Exception as error:
        if settings.log_level.upper() == "DEBUG":
            raise
        line = describe(error) or f"{type(error).__name__}: {error} (--log-level DEBUG shows where)"
        restore_native_stderr()
        message = f"antwort-grpc serve (worker {place.index}): {line}"
        print(one_line(message, settings.log_format, logging.ERROR, __name__), file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
