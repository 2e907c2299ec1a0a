"""DigestCache: what the JSON of Structs and compiled schemas are kept in (structs.py)."""

from __future__ import annotations

from antwort_grpc.structs import DigestCache


def test_the_least_recently_used_go_past_the_limit_counted_by_size() -> None:
    cache: DigestCache[str] = DigestCache(10, len)
    cache.put(b"a", "aaaa")
    cache.put(b"b", "bbbb")
    assert cache.get(b"a") == "aaaa"  # now the most recently used
    cache.put(b"c", "cccc")
    assert cache.get(b"b") is None
    assert cache.get(b"a") == "aaaa"
    assert cache.get(b"c") == "cccc"


def test_a_value_kept_already_stays() -> None:
    cache: DigestCache[object] = DigestCache(2, lambda _: 1)
    first, second = object(), object()
    cache.put(b"k", first)
    cache.put(b"k", second)
    assert cache.get(b"k") is first


def test_a_value_larger_than_the_limit_is_not_kept() -> None:
    cache: DigestCache[str] = DigestCache(3, len)
    cache.put(b"k", "four")
    assert cache.get(b"k") is None
