"""API keys: a file of hashed keys, each naming a principal and a tenant.

One key per line, `#` starts a comment:

    sha256:<64 hex digits>  <principal>  [<tenant>]

Only SHA-256 digests are stored: API keys are long random strings (`antwort-grpc auth new-key`
makes one), so a fast hash is enough and a lookup costs a dictionary probe. The file is read again
whenever it changes (its modification time, size or inode), so keys are added and revoked without
a restart; a file that cannot be parsed keeps the previous keys in force and is logged.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from pathlib import Path

from antwort_grpc.auth.identity import AuthError, Identity

log = logging.getLogger(__name__)

PREFIX = "sha256:"
KEY_PREFIX = "ak_"


def hash_key(key: str) -> str:
    return PREFIX + hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_line(key: str, principal: str, tenant: str = "") -> str:
    return f"{hash_key(key)}  {principal}" + (f"  {tenant}" if tenant else "")


def parse_keys(text: str) -> dict[str, Identity]:
    """digest -> identity; raises ValueError naming the first bad line."""
    keys: dict[str, Identity] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        digest = fields[0].lower()
        hexpart = digest.removeprefix(PREFIX)
        if not digest.startswith(PREFIX) or len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
            raise ValueError(f"line {number}: expected 'sha256:<64 hex digits> principal [tenant]'")
        if len(fields) not in (2, 3):
            raise ValueError(f"line {number}: expected a digest, a principal and optionally a tenant")
        if digest in keys:
            raise ValueError(f"line {number}: the same key is listed twice")
        keys[digest] = Identity(fields[1], fields[2] if len(fields) == 3 else "")
    return keys


class ApiKeyFile:
    """Authenticates API keys against the file, re-reading it when it changed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # Refuses to start on a file that is missing or not valid (OSError, ValueError).
        self._seen: tuple[int, int, int] | None = self._signature()
        self._keys = parse_keys(path.read_text())

    def _signature(self) -> tuple[int, int, int]:
        stat = os.stat(self.path)
        return (stat.st_mtime_ns, stat.st_size, stat.st_ino)

    def _reload(self) -> None:
        try:
            signature = self._signature()
        except OSError as err:
            if self._seen is not None:
                log.error("API key file %s cannot be read (%s); keeping the keys loaded before", self.path, err)
                self._seen = None
            return
        if signature == self._seen:
            return
        # Recorded first: a bad file is reported once, not on every call.
        self._seen = signature
        try:
            keys = parse_keys(self.path.read_text())
        except (OSError, ValueError) as err:
            log.error("API key file %s is not valid (%s); keeping the keys loaded before", self.path, err)
            return
        log.info("API key file %s reloaded: %d keys", self.path, len(keys))
        self._keys = keys

    async def authenticate(self, credential: str) -> Identity:
        self._reload()
        identity = self._keys.get(hash_key(credential))
        if identity is None:
            raise AuthError("unknown API key")
        return identity
