"""Parsers of the client commands."""

from __future__ import annotations

from typing import Any


def add_client_parsers(sub: Any) -> None:
    pass
