"""Every shell block of README.md runs as written, and so does every marked block of docs/*.md (extracted from
the files themselves, so they cannot drift). README stays a newcomer's page: at most 250 lines, its links resolve.

Each ```sh block of README.md is preceded by a marker saying how it is tested (a block of docs/*.md is run
when it carries one; unmarked blocks there are illustrations):

    <!-- readme-test: gateway [SERVE ARGS] -->   run with `antwort-grpc serve [SERVE ARGS]` running
    <!-- readme-test: run until "A", "B" -->      run; it serves until every string was printed
    <!-- readme-test: with the block above, shows "A", "B" -->  run while the block before it serves
                                                 (a "run until" block); its output holds every string
    <!-- readme-test: proved by tests/interop … -->  the scripts it names are run by those tests

Addresses are moved to free ports (the same README address always maps to the same port), and
ANTWORT_TARGET / ANTWORT_LISTEN / ANTWORT_HTTP_LISTEN point the CLI and a gateway a block starts at that address, and
ANTWORT_DATA_DIR keeps their files in a temporary directory: nothing else is changed.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.ports import free_ports

ROOT = Path(__file__).resolve().parents[1]
ANTWORT = str(Path(sys.executable).parent / "antwort-grpc")
_BLOCK = re.compile(r"(?:<!-- readme-test: (?P<marker>.*?) -->\n)?```sh\n(?P<body>.*?)```", re.S)
_ADDRESS = re.compile(r"127\.0\.0\.1:(5\d{4})")
GATEWAY = "127.0.0.1:50051"
# The gateway's HTTP door (Open Responses), moved along with the gRPC address.
HTTP_DOOR = "127.0.0.1:50080"


_LINK = re.compile(r"\]\((?!https?://|#|mailto:)(?P<target>[^)#\s]+)(?:#[^)]*)?\)")
README_MAX_LINES = 250
# Walkthroughs README held before their topics moved to docs/: moving them must not leave them unrun.
MOVED_WALKTHROUGHS = {"docs/clients.md", "docs/controls.md", "docs/executors.md", "docs/hooks.md", "docs/limits.md"}


@dataclass(frozen=True)
class Block:
    file: str
    line: int
    marker: str
    body: str

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"


def blocks_of(path: Path) -> list[Block]:
    text = path.read_text()
    name = str(path.relative_to(ROOT))
    return [
        Block(name, text[: m.start("body")].count("\n") + 1, (m["marker"] or "").strip(), m["body"])
        for m in _BLOCK.finditer(text)
    ]


def readme_blocks() -> list[Block]:
    return blocks_of(ROOT / "README.md")


def docs() -> list[Path]:
    return sorted((ROOT / "docs").glob("*.md"))


def all_blocks() -> list[Block]:
    """README's blocks, then the marked blocks of docs/*.md."""
    return readme_blocks() + [b for path in docs() for b in blocks_of(path) if b.marker]


def blocks_marked(prefix: str) -> list[Block]:
    return [b for b in all_blocks() if b.marker.startswith(prefix)]


def broken_links(path: Path) -> list[str]:
    return [m["target"] for m in _LINK.finditer(path.read_text()) if not (path.parent / m["target"]).exists()]


class Ports:
    """README address -> a free loopback address, the same one every time it is asked."""

    def __init__(self) -> None:
        self.map: dict[str, str] = {}

    def __call__(self, address: str) -> str:
        if address not in self.map:
            given = frozenset(int(moved.rpartition(":")[2]) for moved in self.map.values())
            self.map[address] = f"127.0.0.1:{free_ports(1, avoid=given)[0]}"
        return self.map[address]

    def rewrite(self, text: str) -> str:
        return _ADDRESS.sub(lambda m: self(m[0]), text)


def environment(ports: Ports) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTWORT_")}
    # A gateway a block starts without --listen takes ANTWORT_LISTEN: the same moved address.
    return {
        **env,
        "ANTWORT_TARGET": ports(GATEWAY),
        "ANTWORT_LISTEN": ports(GATEWAY),
        "ANTWORT_HTTP_LISTEN": ports(HTTP_DOOR),
        "NO_COLOR": "1",
    }


def stop(process: subprocess.Popen[str]) -> None:
    """The block's whole process group: the background jobs it started included."""
    with_group = process.pid
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(with_group, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def read_until(process: subprocess.Popen[str], wanted: list[str], timeout: float) -> str:
    """The process's output until every wanted string appeared; fails at the timeout or its exit."""
    assert process.stdout is not None
    # Read from the descriptor, not the buffered file: a readline() that takes two lines into its
    # buffer leaves the second where select() cannot see it.
    fd = process.stdout.fileno()
    seen = ""
    deadline = time.monotonic() + timeout
    while not all(text in seen for text in wanted):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 1 << 16).decode(errors="replace") if ready else ""
        assert chunk, f"missing {[t for t in wanted if t not in seen]} after:\n{seen}"
        seen += chunk
    return seen


@pytest.fixture
def ports() -> Ports:
    return Ports()


def start_gateway(args: list[str], ports: Ports, data_dir: Path) -> Iterator[None]:
    command = [ANTWORT, "serve", "--listen", ports(GATEWAY), "--data-dir", str(data_dir), *args]
    process = subprocess.Popen(
        command, cwd=ROOT, env=environment(ports), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        read_until(process, ["serving on"], 180)
        yield
    finally:
        stop(process)


# The embedded model sometimes rambles to its default cap of output tokens: its answer is then
# `incomplete`, and `ask` exits 1 as documented. That is how the block ran, not a failure of it:
# an `ask` that exits 1 with an incomplete status (human or --json) counts as having run.
CUT_ASK_IS_RUN = """
antwort-grpc() {
  local out code
  out=$(mktemp)
  set +e
  command antwort-grpc "$@" | tee "$out"
  code=${PIPESTATUS[0]}
  set -e
  if [ "$code" = 1 ] && [ "$1" = ask ] && grep -qE '^incomplete · |"incomplete": \\{"response"' "$out"; then code=0; fi
  rm -f "$out"
  return "$code"
}
"""


def run_block(block: Block, ports: Ports, tmp_path: Path, *, cut_ask_is_run: bool = False) -> str:
    prelude = CUT_ASK_IS_RUN if cut_ask_is_run else ""
    result = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", prelude + ports.rewrite(block.body)],
        cwd=ROOT, env={**environment(ports), "TMPDIR": str(tmp_path)}, capture_output=True, text=True,
        timeout=840, start_new_session=True,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{block.id} failed ({result.returncode}):\n{output}"
    assert "Traceback" not in output, output
    return output


def test_every_shell_block_says_how_it_is_tested() -> None:
    for block in readme_blocks():
        assert block.marker.startswith(("gateway", "run until ", "proved by ")), f"{block.id} has no readme-test marker"
    for block in all_blocks():
        assert block.marker.startswith(("gateway", "run until ", "proved by ", "with the block above")), (
            f"{block.id}: unknown marker"
        )
    run_in_docs = {b.file for b in all_blocks() if b.file.startswith("docs/")}
    assert run_in_docs >= MOVED_WALKTHROUGHS, f"no longer run: {sorted(MOVED_WALKTHROUGHS - run_in_docs)}"


def test_readme_is_a_newcomers_page_of_at_most_250_lines() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move details to a docs/ page and link it"


def test_every_docs_page_is_linked_from_readme_and_every_link_resolves() -> None:
    readme = (ROOT / "README.md").read_text()
    assert broken_links(ROOT / "README.md") == []
    for path in docs():
        assert f"(docs/{path.name})" in readme, f"README does not link docs/{path.name}"


def test_every_relative_link_in_docs_resolves() -> None:
    for path in docs():
        assert broken_links(path) == [], f"{path.name} links to missing files"


def test_the_tool_walkthrough_gateway_is_what_make_run_tools_starts() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for block in blocks_marked("gateway "):
        assert f"antwort-grpc serve {block.marker.removeprefix('gateway ')}" in makefile


# The embedded model answers every command of a block for real: minutes on a busy 2-core machine.
@pytest.mark.timeout(900)
@pytest.mark.parametrize("block", blocks_marked("gateway"), ids=lambda b: b.id)
def test_readme_block_runs_against_a_fresh_gateway(block: Block, ports: Ports, tmp_path: Path) -> None:
    args = block.marker.removeprefix("gateway").split()
    gateway = start_gateway(args, ports, tmp_path / "data")
    next(gateway)
    try:
        output = run_block(block, ports, tmp_path, cut_ask_is_run=not args)
    finally:
        gateway.close()
    if "--script examples/tool_caller.json" in block.marker:
        # The walkthrough reaches requires_action, continues with the result, and asks for approval.
        assert "waiting for your result of call_" in output
        assert "RESPONSE_STATUS_REQUIRES_ACTION" in output
        assert 'The tool answered: {\\"temp\\": 21}' in output
        assert 'approve get_weather {"city": "Paris"}? [y/n]' in output
    if "--tool-choice required" in block.body:
        # README "Tools": what the embedded model cannot do is refused before any response exists.
        assert re.search(r"INVALID_ARGUMENT: tool_choice: .*does not call tools", output), output
        assert re.search(r"NOT_FOUND: .*'gpt-4o'", output), output
        assert output.count("exit 2") == 2 and "resp_" not in output, output
    elif "antwort-grpc ask" in block.body and not args:
        # The small model may also stop at the embedded default limit of output tokens.
        assert re.search(r"(completed|incomplete) · resp_\w+ · smollm2-135m-instruct · ", output), output


def start_services(block: Block, ports: Ports, data_dir: Path) -> Iterator[str]:
    """A "run until" block, serving: what it printed until every string of its marker showed."""
    wanted = re.findall(r'"([^"]+)"', block.marker)
    process = subprocess.Popen(
        ["bash", "-e", "-c", ports.rewrite(block.body)],
        cwd=ROOT, env={**environment(ports), "ANTWORT_DATA_DIR": str(data_dir)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        yield read_until(process, wanted, 180)
    finally:
        stop(process)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("block", blocks_marked("run until "), ids=lambda b: b.id)
def test_readme_block_starts_its_services(block: Block, ports: Ports, tmp_path: Path) -> None:
    services = start_services(block, ports, tmp_path)
    seen = next(services)
    services.close()
    assert "Traceback" not in seen, seen


def block_before(block: Block) -> Block:
    blocks = blocks_of(ROOT / block.file)
    before = blocks[[b.line for b in blocks].index(block.line) - 1]
    assert before.marker.startswith("run until "), f"{block.id}: the block above it serves nothing"
    return before


@pytest.mark.timeout(300)
@pytest.mark.parametrize("block", blocks_marked("with the block above"), ids=lambda b: b.id)
def test_readme_block_runs_against_the_services_the_block_above_starts(
    block: Block, ports: Ports, tmp_path: Path
) -> None:
    services = start_services(block_before(block), ports, tmp_path / "data")
    next(services)
    try:
        output = run_block(block, ports, tmp_path)
    finally:
        services.close()
    for wanted in re.findall(r'"([^"]+)"', block.marker):
        assert wanted in output, f"{block.id} never showed {wanted!r}:\n{output}"


@pytest.mark.parametrize("block", blocks_marked("proved by "), ids=lambda b: b.id)
def test_readme_block_is_run_by_the_tests_it_names(block: Block) -> None:
    tests = "".join(p.read_text() for p in (ROOT / "tests/interop").glob("test_*.py"))
    scripts = re.findall(r"(examples/\S+\.(?:sh|js))", block.body)
    assert scripts
    for script in scripts:
        name = script.rsplit("/", 1)[-1]
        assert script in tests or f'"{name}"' in tests, f"{script} is not run by tests/interop"
