"""Shared fixtures, and which tests are heavy.

Heavy tests run real toolchains, the real model or whole README walkthroughs: each takes tens of
seconds to minutes. `make test` (and CI) runs everything; `make test-fast` (`pytest -m "not
heavy"`) is the inner loop without them. The list is here, in one place, rather than a marker in
each file, so that what the inner loop leaves out can be read at a glance.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import settings

# Property tests run the same examples on every run (a failure in CI is one a developer gets
# again), and without hypothesis's 200 ms deadline per example: a timed assertion, which a loaded
# host fails (it did: one example of a mapping test took 520 ms while the suite ran beside).
settings.register_profile("antwort", deadline=None, derandomize=True, database=None)
settings.load_profile("antwort")

# A suite started in the background by a non-interactive shell (`make test &`, a CI step run that
# way) inherits SIGINT ignored, and so would every process it starts: the client's Ctrl-C tests
# would send a signal their CLI never sees. A Python handler here becomes the default in them.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Node id prefixes (as pytest prints them), and why each is heavy.
HEAVY = {
    "tests/test_readme.py::test_readme_block_": "README blocks against fresh gateways on the embedded model (minutes)",
    "tests/test_bench_smoke.py": "builds the Go load generator and runs every benchmark figure",
    "tests/interop/test_go_client.py": "builds and runs the Go example client",
    "tests/interop/test_java_client.py": "compiles and runs the Java example client",
    "tests/interop/test_node_client.py": "installs the Node example's npm packages and runs it",
    "tests/interop/test_node_http_client.py": "installs the OpenAI JS SDK from npm and runs the HTTP example",
    "tests/providers/test_local_model.py::test_the_local_model_": "starts the real embedded model",
    "tests/providers/test_local_model.py::test_the_response_names_": "starts the real embedded model",
    "tests/test_fuzz_requests.py::test_any_request_gets_a_typed_answer": "hundreds of generated requests",
    "tests/storage/test_durability.py": "kills and restarts gateway processes",
    "tests/storage/test_durable_runs.py": "kills, restarts and rolls gateway replicas under background runs",
    "tests/interop/test_go_keepalive.py": "a Go client holds an idle stream for a real minute",
    "tests/test_batched_events.py::test_the_scenario_tests_pass_with_every_stream_batched": "the scenario suites again",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    heavy = pytest.mark.heavy
    for item in items:
        if item.nodeid.startswith(tuple(HEAVY)):
            item.add_marker(heavy)


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> Mapping[str, Callable[[], Any]]:
    """The tests' own loop is the standard library's: tests start many processes from it (the
    gateway, tmux, MCP servers, clients), and uvloop runs Python's at-fork hooks in a child before
    exec (uvloop issue 749), where one now and then crashed the child. What ships is still tested
    on uvloop: every `serve`, executor and hook process a test starts runs on it (the default of
    ANTWORT_EVENT_LOOP). `ANTWORT_TEST_LOOP=uvloop` runs the in-process servers on uvloop too."""
    if os.environ.get("ANTWORT_TEST_LOOP", "") == "uvloop":
        import uvloop

        return {"uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}
