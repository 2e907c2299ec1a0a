"""Ids for responses and items: a kind prefix and 24 random hex digits, like the Responses API.

The random digits come from os.urandom in blocks of 1,024 ids rather than one call per id: each call
lets go of the GIL, and a request of 2,048 items made 2,048 such calls on the event loop, each
waiting up to a switch interval (5 ms) to get the GIL back from a busy worker thread — seconds
of a stalled loop. The digits are as random as before; only the system calls are fewer.
"""

from __future__ import annotations

import os
import threading

_BLOCK_IDS = 1024
_DIGITS = 24
_lock = threading.Lock()  # ids are made on the event loop and in worker threads
_block = ""
_used = 0


def _digits() -> str:
    global _block, _used
    with _lock:
        if _used + _DIGITS > len(_block):
            _block = os.urandom(_BLOCK_IDS * _DIGITS // 2).hex()
            _used = 0
        start = _used
        _used = start + _DIGITS
    return _block[start : start + _DIGITS]


def new_id(prefix: str) -> str:
    return f"{prefix}_{_digits()}"


def response_id() -> str:
    return new_id("resp")
