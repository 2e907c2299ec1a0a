"""The file descriptors the process may hold, and how they are shared between the doors.

Every connection is a descriptor. With no bound on either door, 20,000 idle HTTP connections took
every descriptor of a process limited to 20,000: new gRPC connections, the store's files and the
model backend's connections all failed. So the soft limit is raised to the hard one at start-up
(the kernel's default soft limit is often 1,024 when the hard one is far higher), a reserve is
kept for what is not a client's connection, and each door gets at most half of the rest: neither
door can take the other's room.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

log = logging.getLogger(__name__)

# Descriptors kept for what is not a client's connection: the store (a SQLite file and its journal,
# or PostgreSQL's pool), the model backend's connections (one per running response, 512 by
# default), executors' and hooks' channels, sandbox pipes, logs, the metrics port, gRPC's and the
# event loop's own (epoll, eventfds). A quarter of the limit when that is less.
RESERVED = 2048
# The most a door admits by default whatever the limit: past it idle connections cost memory (about
# 8 KiB each in the process) for no stream the event loop could serve.
MOST_PER_DOOR = 10_000
# A door is never bounded below this by default, even with a tiny limit.
LEAST_PER_DOOR = 16


@dataclass(frozen=True, slots=True)
class DoorBounds:
    """Default bounds of open connections, from the descriptor limit."""

    http: int
    grpc: int


def soft_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def raise_soft_limit() -> int:
    """The soft limit of open files raised to the hard one (what an unprivileged process may do);
    the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as err:
            # macOS refuses more than its OPEN_MAX for an unlimited hard limit: keep what we have.
            log.warning("cannot raise the open-files limit from %d to %d: %s", soft, hard, err)
    return soft_limit()


def door_bounds(limit: int | None = None) -> DoorBounds:
    """Each door's default bound for a limit of `limit` descriptors (default: the current one)."""
    limit = soft_limit() if limit is None else limit
    reserved = min(RESERVED, limit // 4)
    each = min(MOST_PER_DOOR, max(LEAST_PER_DOOR, (limit - reserved) // 2))
    return DoorBounds(http=each, grpc=each)
