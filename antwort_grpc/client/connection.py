"""Where the client connects and how: target, TLS and credentials, as grpcurl takes them.

Plaintext is the default for a loopback target (the gateway's own default) and TLS for any other,
unless `--plaintext` or `--tls` says otherwise; `--cacert`, `--cert` and `--key` mean TLS. Headers
(`-H 'name: value'`) and a bearer token go on every call as metadata. A connection that fails says
what is wrong with it (client/diagnose.py).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from antwort_grpc.client.diagnose import connection_problem
from antwort_grpc.startup_errors import StartupError

DEFAULT_TARGET = "127.0.0.1:50051"
_LOOPBACK = ("127.", "localhost", "[::1]", "::1")


@dataclass(frozen=True)
class Connection:
    target: str = DEFAULT_TARGET
    plaintext: bool = True
    cacert: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    authority: str | None = None
    metadata: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def channel(self) -> grpc.aio.Channel:
        options = [("grpc.default_authority", self.authority)] if self.authority else []
        if self.plaintext:
            return grpc.aio.insecure_channel(self.target, options=options)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(self.cacert, "--cacert"),
            private_key=_read(self.key, "--key"),
            certificate_chain=_read(self.cert, "--cert"),
        )
        if self.authority:
            options.append(("grpc.ssl_target_name_override", self.authority))
        return grpc.aio.secure_channel(self.target, credentials, options=options)

    def unreachable(self, details: str) -> str:
        """The one line for a call that could not connect (UNAVAILABLE)."""
        problem = connection_problem(
            details,
            self.target,
            plaintext=self.plaintext,
            cacert=str(self.cacert) if self.cacert else None,
            cert=str(self.cert) if self.cert else None,
        )
        if problem is not None:
            return f"cannot connect to the gateway at {self.target}: {problem}"
        return f"cannot reach the gateway at {self.target} ({details}): start it, or set --target / ANTWORT_TARGET"


def _read(path: Path | None, flag: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as error:
        raise StartupError(f"{flag}: cannot read {path}: {error.strerror}") from error


def add_connection_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("connection (like grpcurl's)")
    g.add_argument("-t", "--target", help=f"host:port of the gateway (ANTWORT_TARGET, default {DEFAULT_TARGET})")
    mode = g.add_mutually_exclusive_group()
    mode.add_argument("--plaintext", action="store_true", default=None, help="no TLS (default for loopback targets)")
    mode.add_argument("--tls", action="store_true", default=None, help="TLS (default for other targets)")
    g.add_argument("--cacert", type=Path, help="CA certificates to verify the server (ANTWORT_CACERT)")
    g.add_argument("--cert", type=Path, help="client certificate for mutual TLS (ANTWORT_CERT)")
    g.add_argument("--key", type=Path, help="client private key for mutual TLS (ANTWORT_KEY)")
    g.add_argument("--authority", help="the :authority / TLS server name to use")
    g.add_argument(
        "-H",
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="metadata on every call, repeatable",
    )
    g.add_argument("--token", help="bearer token: 'authorization: Bearer TOKEN' (ANTWORT_TOKEN)")


def _flag_or_env(value: object, variable: str) -> str | None:
    if value is not None:
        return str(value)
    return os.environ.get(variable) or None


def connection_from(args: argparse.Namespace) -> Connection:
    target = _flag_or_env(args.target, "ANTWORT_TARGET") or DEFAULT_TARGET
    paths = {name: _flag_or_env(getattr(args, name), f"ANTWORT_{name.upper()}") for name in ("cacert", "cert", "key")}
    given = [f"--{name}" for name, path in paths.items() if path]
    if args.plaintext:
        if given:
            raise StartupError(f"{' and '.join(given)} need TLS: drop --plaintext")
        plaintext = True
    elif args.tls or given:
        # A CA or a client certificate means TLS, whatever the target.
        plaintext = False
    else:
        plaintext = target.startswith(_LOOPBACK)
    metadata: list[tuple[str, str]] = []
    for header in args.header:
        name, sep, value = header.partition(":")
        if not sep or not name.strip():
            raise StartupError(f"-H {header!r}: expected 'name: value'")
        metadata.append((name.strip().lower(), value.strip()))
    if token := _flag_or_env(args.token, "ANTWORT_TOKEN"):
        metadata.append(("authorization", f"Bearer {token}"))
    return Connection(
        target=target,
        plaintext=plaintext,
        cacert=Path(paths["cacert"]) if paths["cacert"] else None,
        cert=Path(paths["cert"]) if paths["cert"] else None,
        key=Path(paths["key"]) if paths["key"] else None,
        authority=args.authority,
        metadata=tuple(metadata),
    )
