"""Ids for responses and items: a kind prefix and 24 random hex digits, like the Responses API."""

from __future__ import annotations

import os


def new_id(prefix: str) -> str:
    return f"{prefix}_{os.urandom(12).hex()}"


def response_id() -> str:
    return new_id("resp")
