"""`antwort-grpc`: the gateway (`serve`), executor services (`executor …`), `migrate`, and the
clients `ask` and `chat`.

Flags override ANTWORT_* environment variables, which override the defaults in config.py. A
command that fails prints one line naming the setting to change and exits 2; `--log-level DEBUG`
(or ANTWORT_LOG_LEVEL=DEBUG) shows the traceback instead.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsError

from antwort_grpc import event_loop
from antwort_grpc.config import GatewaySettings
from antwort_grpc.startup_errors import (
    StartupError,
    bind_error,
    check_listen,
    describe,
    is_bind_failure,
    settings_error,
)


def _serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the gateway (ResponsesService)")
    p.add_argument("--listen", help="host:port (ANTWORT_LISTEN, default 127.0.0.1:50051)")
    p.add_argument(
        "--http-listen",
        help="host:port of the Open Responses HTTP door, off: none (ANTWORT_HTTP_LISTEN, default 127.0.0.1:50080)",
    )
    p.add_argument("--backend-url", help="OpenAI-compatible base URL (ANTWORT_BACKEND_URL)")
    p.add_argument("--model", help="default model (ANTWORT_MODEL)")
    p.add_argument("--store", help="memory | sqlite:///file.db | postgresql://… (ANTWORT_STORE)")
    p.add_argument("--executor", action="append", dest="executors", help="ToolExecutorService target, repeatable")
    p.add_argument("--max-turns", type=int, help="agentic turn limit (ANTWORT_MAX_TURNS, default 10)")
    p.add_argument(
        "--hook",
        action="append",
        dest="hooks",
        help="HookService target or module:Class, [;timeout=S][;failure=open|closed], repeatable (ANTWORT_HOOKS)",
    )
    p.add_argument("--log-level", help="ANTWORT_LOG_LEVEL, default INFO")
    p.add_argument("--log-format", choices=["text", "json"], help="ANTWORT_LOG_FORMAT, default text")
    p.add_argument("--metrics-listen", help="host:port of the Prometheus /metrics endpoint (ANTWORT_METRICS_LISTEN)")
    p.add_argument("--script", help="JSON file of scripted model turns instead of a backend (ANTWORT_SCRIPT)")
    p.add_argument("--data-dir", help="directory for the embedded defaults (ANTWORT_DATA_DIR, default var)")
    p.add_argument(
        "--workers",
        type=int,
        help="processes serving the same ports (ANTWORT_WORKERS; default: one per usable core with a "
        "PostgreSQL store, else 1)",
    )
    p.set_defaults(run=_serve)


def _migrate_parser(sub: Any) -> None:
    p = sub.add_parser("migrate", help="apply the store's schema migrations and exit")
    p.add_argument("--store", help="the store URL (ANTWORT_STORE)")
    p.add_argument("--data-dir", help="ANTWORT_DATA_DIR")
    p.set_defaults(run=_migrate)


def _auth_parser(sub: Any) -> None:
    p = sub.add_parser("auth", help="authentication helpers")
    auth_sub = p.add_subparsers(dest="auth_command", required=True)
    new = auth_sub.add_parser("new-key", help="make an API key; prints the key and its line for ANTWORT_API_KEYS_FILE")
    new.add_argument("--principal", required=True)
    new.add_argument("--tenant", default="")
    new.set_defaults(run=_new_key)


def _new_key(args: argparse.Namespace) -> int:
    from antwort_grpc.auth.apikeys import key_line, new_key

    if not args.principal.strip() or any(c.isspace() for c in args.principal + args.tenant):
        print("principal and tenant must be single words", file=sys.stderr)
        return 2
    key = new_key()
    print(f"key:  {key}")
    print(f"line: {key_line(key, args.principal, args.tenant)}")
    return 0


def _overrides(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


# The settings `serve` has a flag for (the others are environment variables only).
SERVE_FLAGS = [
    "listen",
    "http_listen",
    "backend_url",
    "model",
    "store",
    "executors",
    "hooks",
    "max_turns",
    "log_level",
    "log_format",
    "metrics_listen",
    "script",
    "data_dir",
    "workers",
]


def gateway_settings(args: argparse.Namespace) -> GatewaySettings:
    try:
        return GatewaySettings(**_overrides(args, SERVE_FLAGS))
    except (ValidationError, SettingsError) as error:
        raise settings_error(GatewaySettings, error, SERVE_FLAGS) from error


def _loop_for(settings: GatewaySettings) -> str | None:
    """The embedded local model is a process the gateway starts: that gateway runs on the standard
    loop, since uvloop runs Python's at-fork hooks in a child before exec (uvloop issue 749),
    where one now and then crashed the child. A gateway with a backend URL or a script starts no
    process and runs on ANTWORT_EVENT_LOOP's (uvloop by default)."""
    return None if settings.backend_url or settings.script is not None else "asyncio"


def _serve(args: argparse.Namespace) -> int:
    settings = gateway_settings(args)
    _logging(settings.log_level, settings.log_format, native=True)
    check_listen(settings.listen, "--listen / ANTWORT_LISTEN")
    if "http_listen" in settings.model_fields_set and settings.http_listen.strip().lower() not in ("", "off"):
        # A set HTTP address must bind (its default may be taken: the door is then off).
        check_listen(settings.http_listen, "--http-listen / ANTWORT_HTTP_LISTEN")
    from antwort_grpc.gateway import serve
    from antwort_grpc.workers.plan import planned, ready_saying

    workers, why = planned(settings)
    try:
        if workers > 1:
            from antwort_grpc.workers.supervisor import supervise

            # The parent starts processes and serves no request: the standard loop (see _loop_for).
            event_loop.run(supervise(settings, workers), "asyncio")
        else:
            event_loop.run(serve(settings, ready_saying(why, settings.log_format)), _loop_for(settings))
    except (RuntimeError, OSError) as error:
        if is_bind_failure(error) or str(error).startswith("cannot listen on"):
            raise bind_error(settings.listen, "--listen / ANTWORT_LISTEN") from error
        raise
    return 0


def _migrate(args: argparse.Namespace) -> int:
    try:
        settings = GatewaySettings(**_overrides(args, ["store", "data_dir"]))
    except (ValidationError, SettingsError) as error:
        raise settings_error(GatewaySettings, error, ["store", "data_dir"]) from error
    _logging(settings.log_level)
    from antwort_grpc.storage.factory import migrate

    print(asyncio.run(migrate(settings.store, settings.data_dir)))
    return 0


def _logging(level: str, log_format: str = "text", native: bool = False) -> None:
    """Logging to stderr in `log_format`; `native`: grpcio's own lines too (observability/logs.py)."""
    if not isinstance(logging.getLevelName(level.upper()), int):
        raise StartupError(f"--log-level / ANTWORT_LOG_LEVEL: unknown level {level!r} (DEBUG, INFO, WARNING, ERROR)")
    from antwort_grpc.observability.logs import configure, route_native_stderr

    configure(level, log_format, route_native_stderr() if native else None)


def _wants_traceback(args: argparse.Namespace) -> bool:
    levels = [getattr(args, "log_level", None), os.environ.get("ANTWORT_LOG_LEVEL")]
    levels.append(os.environ.get("ANTWORT_EXECUTOR_LOG_LEVEL"))
    levels.append(os.environ.get("ANTWORT_HOOK_LOG_LEVEL"))
    return any(isinstance(level, str) and level.upper() == "DEBUG" for level in levels)


def _log_format(args: argparse.Namespace) -> str:
    """The log format a failed command asked for, even when its settings did not load."""
    if args.command != "serve":
        return "text"
    return str(getattr(args, "log_format", None) or os.environ.get("ANTWORT_LOG_FORMAT") or "text").lower()


def _last_words(args: argparse.Namespace, line: str) -> None:
    """The one line a failed command ends with, on the real stderr, in its log format."""
    from antwort_grpc.observability.logs import one_line, restore_native_stderr

    restore_native_stderr()
    print(one_line(line, _log_format(args), logging.ERROR, "antwort_grpc.cli"), file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv)[:1] in (["ask"], ["chat"]):
        # grpcio's own lines (a failed TLS handshake, logged at INFO) would stand beside the one
        # line the client prints about it; read once, when grpc is first imported (just below).
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    parser = argparse.ArgumentParser(prog="antwort-grpc", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _migrate_parser(sub)
    _auth_parser(sub)
    from antwort_grpc.client.cli import add_client_parsers
    from antwort_grpc.hooks.cli import add_hook_parser
    from antwort_grpc.tool_services.cli import add_executor_parser

    add_executor_parser(sub)
    add_client_parsers(sub)
    add_hook_parser(sub)
    args = parser.parse_args(argv)
    try:
        result: int = args.run(args)
    except Exception as error:
        if _wants_traceback(args):
            raise
        line = describe(error) or f"{type(error).__name__}: {error} (--log-level DEBUG shows where)"
        _last_words(args, f"antwort-grpc {args.command}: {line}")
        return 2
    return result


if __name__ == "__main__":
    sys.exit(main())
