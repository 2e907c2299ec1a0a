"""Ids: a kind prefix and 24 random hex digits, never the same twice, from any thread."""

from __future__ import annotations

import re
import threading

from antwort_grpc.ids import new_id, response_id

ID = re.compile(r"^[a-z]+_[0-9a-f]{24}$")


def test_ids_made_on_many_threads_at_once_are_well_formed_and_never_repeat() -> None:
    made: list[list[str]] = [[] for _ in range(8)]

    def make(into: list[str]) -> None:
        # Far more than one block of random digits per thread, so blocks are drawn while others read.
        into.extend(new_id("msg") for _ in range(5_000))

    threads = [threading.Thread(target=make, args=(into,)) for into in made]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ids = [i for into in made for i in into] + [response_id() for _ in range(100)]
    assert all(ID.match(i) for i in ids), [i for i in ids if not ID.match(i)][:3]
    assert len(set(ids)) == len(ids)
