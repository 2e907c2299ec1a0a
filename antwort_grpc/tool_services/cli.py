"""`antwort-grpc executor <role>`: run one ToolExecutorService (sandbox, MCP bridge, your own).

Every role takes `--listen` (ANTWORT_EXECUTOR_LISTEN) and `--log-level` the same way; a role adds
its own flags in its parser function, listed in ROLES.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsError

from antwort_grpc import event_loop
from antwort_grpc.config import ExecutorSettings
from antwort_grpc.startup_errors import StartupError, bind_error, check_listen, is_bind_failure, settings_error
from antwort_grpc.tool_services.sdk import ExecutorService, run_executor
from antwort_grpc.tool_services.security import executor_security


def common_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", help="host:port (ANTWORT_EXECUTOR_LISTEN, default 127.0.0.1:50061)")
    p.add_argument("--log-level", help="ANTWORT_EXECUTOR_LOG_LEVEL, default INFO")
    p.add_argument("--token-file", help="callers must send this token as a bearer (ANTWORT_EXECUTOR_TOKEN_FILE)")
    p.add_argument("--tls-cert", help="TLS certificate chain, PEM (ANTWORT_EXECUTOR_TLS_CERT)")
    p.add_argument("--tls-key", help="TLS private key, PEM (ANTWORT_EXECUTOR_TLS_KEY)")
    p.add_argument(
        "--tls-client-ca", help="CA of the callers' certificates: mutual TLS (ANTWORT_EXECUTOR_TLS_CLIENT_CA)"
    )
    p.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        default=None,
        help="serve a non-loopback address without a token or mutual TLS (ANTWORT_EXECUTOR_ALLOW_UNAUTHENTICATED)",
    )


def executor_settings(args: argparse.Namespace) -> ExecutorSettings:
    names = ["listen", "log_level", "token_file", "tls_cert", "tls_key", "tls_client_ca", "allow_unauthenticated"]
    try:
        return ExecutorSettings(**{n: getattr(args, n) for n in names if getattr(args, n, None) is not None})
    except (ValidationError, SettingsError) as error:
        raise settings_error(ExecutorSettings, error, names) from error


def serve_role(settings: ExecutorSettings, service: ExecutorService) -> int:
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    security = executor_security(
        settings.token,
        settings.token_file,
        settings.tls_cert,
        settings.tls_key,
        settings.tls_client_ca,
        allow_unauthenticated=settings.allow_unauthenticated,
    )
    security.refuse_open_listen(settings.listen)
    check_listen(settings.listen, "--listen / ANTWORT_EXECUTOR_LISTEN")
    try:
        event_loop.run(run_executor(service, settings.listen, security=security), service.event_loop)
    except (RuntimeError, OSError) as error:
        if is_bind_failure(error) or str(error).startswith("cannot listen on"):
            raise bind_error(settings.listen, "--listen / ANTWORT_EXECUTOR_LISTEN") from error
        raise
    return 0


def _custom_parser(roles: Any) -> None:
    p = roles.add_parser("run", help="run your own ExecutorService subclass (module:Class)")
    p.add_argument("service", help="import path of the class, e.g. examples.weather_executor:Weather")
    common_flags(p)
    p.set_defaults(run=_run_custom)


def load_service(path: str) -> ExecutorService:
    module_name, _, class_name = path.partition(":")
    if not class_name:
        raise StartupError(f"{path!r}: expected module:Class")
    # Like `python -m`: a module next to where the command runs (examples/, your project) imports.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        raise StartupError(
            f"cannot load {path}: {error} (run from the directory that holds {module_name.split('.')[0]})"
        ) from error
    service = cls()
    if not isinstance(service, ExecutorService):
        raise StartupError(f"{path!r} is not an ExecutorService subclass")
    return service


def _run_custom(args: argparse.Namespace) -> int:
    return serve_role(executor_settings(args), load_service(args.service))


def _mcp_parser(roles: Any) -> None:
    p = roles.add_parser("mcp", help="the MCP bridge: tools of the configured MCP servers (docs/mcp.md)")
    p.add_argument("--config", help="JSON file listing the MCP servers (ANTWORT_MCP_CONFIG)")
    common_flags(p)
    p.set_defaults(run=_run_mcp)


def _run_mcp(args: argparse.Namespace) -> int:
    # Imported here: only this role loads the MCP SDK.
    from antwort_grpc.tool_services.mcp import McpBridge, McpBridgeSettings

    settings = McpBridgeSettings(**({"config": args.config} if args.config else {}))
    # The SDK's HTTP client logs every MCP request at INFO.
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    return serve_role(executor_settings(args), McpBridge.from_settings(settings))


def _sandbox_parser(roles: Any) -> None:
    p = roles.add_parser("sandbox", help="run Python code, isolated (ANTWORT_SANDBOX_*; docs/sandbox.md)")
    common_flags(p)
    p.set_defaults(run=_run_sandbox)


def _run_sandbox(args: argparse.Namespace) -> int:
    from antwort_grpc.tool_services.sandbox import SandboxError, SandboxService

    try:
        return serve_role(executor_settings(args), SandboxService())
    except SandboxError as err:  # it would run code without the isolation it promises
        raise SystemExit(f"antwort-grpc executor sandbox: {err}") from None


# Parser functions of the roles: each adds one subcommand under `executor`.
ROLES: list[Callable[[Any], None]] = [_custom_parser, _mcp_parser, _sandbox_parser]


def add_executor_parser(sub: Any) -> None:
    p = sub.add_parser("executor", help="run a ToolExecutorService (sandbox, mcp, or your own)")
    roles = p.add_subparsers(dest="role", required=True)
    for add in ROLES:
        add(roles)
