"""`antwort-grpc`: the gateway (`serve`), executor services (`executor …`) and `migrate`.

Flags override ANTWORT_* environment variables, which override the defaults in config.py.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

from antwort_grpc.config import GatewaySettings


def _serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the gateway (ResponsesService)")
    p.add_argument("--listen", help="host:port (ANTWORT_LISTEN, default 127.0.0.1:50051)")
    p.add_argument("--backend-url", help="OpenAI-compatible base URL (ANTWORT_BACKEND_URL)")
    p.add_argument("--model", help="default model (ANTWORT_MODEL)")
    p.add_argument("--store", help="memory | sqlite:///file.db | postgresql://… (ANTWORT_STORE)")
    p.add_argument("--executor", action="append", dest="executors", help="ToolExecutorService target, repeatable")
    p.add_argument("--max-turns", type=int, help="agentic turn limit (ANTWORT_MAX_TURNS, default 10)")
    p.add_argument("--log-level", help="ANTWORT_LOG_LEVEL, default INFO")
    p.add_argument("--script", help="JSON file of scripted model turns instead of a backend (ANTWORT_SCRIPT)")
    p.add_argument("--data-dir", help="directory for the embedded defaults (ANTWORT_DATA_DIR, default var)")
    p.set_defaults(run=_serve)


def _migrate_parser(sub: Any) -> None:
    p = sub.add_parser("migrate", help="apply the store's schema migrations and exit")
    p.add_argument("--store", help="the store URL (ANTWORT_STORE)")
    p.add_argument("--data-dir", help="ANTWORT_DATA_DIR")
    p.set_defaults(run=_migrate)


def _overrides(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def gateway_settings(args: argparse.Namespace) -> GatewaySettings:
    names = ["listen", "backend_url", "model", "store", "executors", "max_turns", "log_level", "script", "data_dir"]
    return GatewaySettings(**_overrides(args, names))


def _serve(args: argparse.Namespace) -> int:
    settings = gateway_settings(args)
    _logging(settings.log_level)
    from antwort_grpc.server.run import serve

    asyncio.run(serve(settings))
    return 0


def _migrate(args: argparse.Namespace) -> int:
    settings = GatewaySettings(**_overrides(args, ["store", "data_dir"]))
    _logging(settings.log_level)
    from antwort_grpc.storage.factory import migrate

    print(asyncio.run(migrate(settings.store, settings.data_dir)))
    return 0


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="antwort-grpc", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _migrate_parser(sub)
    from antwort_grpc.tool_services.cli import add_executor_parser

    add_executor_parser(sub)
    args = parser.parse_args(argv)
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
