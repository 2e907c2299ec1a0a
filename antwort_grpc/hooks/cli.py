"""`antwort-grpc hook run module:Class`: serve a PolicyHook as an antwort.v1.HookService."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsError

from antwort_grpc import event_loop
from antwort_grpc.config import HookSettings
from antwort_grpc.startup_errors import StartupError, bind_error, check_listen, is_bind_failure, settings_error


def add_hook_parser(sub: Any) -> None:
    p = sub.add_parser("hook", help="run a HookService (policy around the agentic loop)")
    roles = p.add_subparsers(dest="role", required=True)
    run = roles.add_parser("run", help="serve your own PolicyHook subclass (module:Class)")
    run.add_argument("hook", help="import path of the class, e.g. examples.redact_hook:DenyAndRedact")
    run.add_argument("--listen", help="host:port (ANTWORT_HOOK_LISTEN, default 127.0.0.1:50071)")
    run.add_argument("--log-level", help="ANTWORT_HOOK_LOG_LEVEL, default INFO")
    run.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from antwort_grpc.hooks.clients import load_hook_class
    from antwort_grpc.hooks.server import run_hook

    names = ["listen", "log_level"]
    try:
        settings = HookSettings(**{n: getattr(args, n) for n in names if getattr(args, n, None) is not None})
    except (ValidationError, SettingsError) as error:
        raise settings_error(HookSettings, error, names) from error
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    check_listen(settings.listen, "--listen / ANTWORT_HOOK_LISTEN")
    try:
        hook = load_hook_class(args.hook)
    except ValueError as error:
        raise StartupError(str(error)) from error
    try:
        event_loop.run(run_hook(hook, settings.listen))
    except (RuntimeError, OSError) as error:
        if is_bind_failure(error) or str(error).startswith("cannot listen on"):
            raise bind_error(settings.listen, "--listen / ANTWORT_HOOK_LISTEN") from error
        raise
    return 0
