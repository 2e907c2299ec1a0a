"""A real PostgreSQL for the tests: $ANTWORT_TEST_POSTGRES_URL when set, otherwise a throwaway
cluster (initdb into a temporary directory, a free loopback port) that is removed at the end.

On a clean machine the Debian package is installed first (apt). initdb refuses to run as root,
so as root the cluster belongs to the `postgres` user the package creates.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ENV_URL = "ANTWORT_TEST_POSTGRES_URL"


def _installed() -> list[str]:
    """initdb of every installed major version, newest last."""
    return sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[4]))


def _bin_dir() -> Path:
    found = _installed()
    if not found:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        sudo = [] if os.geteuid() == 0 else ["sudo"]
        subprocess.run([*sudo, "apt-get", "update", "-qq"], check=True, env=env)
        install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "postgresql"]
        subprocess.run([*sudo, *install], check=True, env=env, stdout=subprocess.DEVNULL)
        found = _installed()
    return Path(found[-1]).parent


def install() -> None:
    """Debian's package, installed when missing (before a run that must not spend its time on it)."""
    _bin_dir()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def throwaway_cluster() -> Iterator[str]:
    """Start a cluster; yield its admin URL; stop it and delete its files."""
    bin_dir = _bin_dir()
    root = Path(tempfile.mkdtemp(prefix="antwort-pg-"))
    user: str | None = None
    if os.geteuid() == 0:
        user = "postgres"
        entry = pwd.getpwnam(user)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    data, log = root / "data", root / "log"
    port = _free_port()

    def run(*args: str) -> None:
        subprocess.run(args, check=True, user=user, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    # Surviving a power cut is not under test here: fsync off makes startup and every commit fast.
    settings = (
        f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c max_connections=300"
        " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    )
    try:
        run(str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        run(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-o", settings, "start")
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            run(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def postgres_server() -> Iterator[str]:
    url = os.environ.get(ENV_URL)
    if url:
        yield url
        return
    with throwaway_cluster() as started:
        yield started
