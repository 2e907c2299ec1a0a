"""The shape of the code holds: no function of the engine, the responses layer or durable runs above cyclomatic
complexity 15, no import cycle between modules or between packages (so no import runs upward),
and the separate tool programs depend on none of the gateway's own layers."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from radon.complexity import cc_visit

ROOT = Path(__file__).resolve().parents[1] / "antwort_grpc"
MAX_COMPLEXITY = 15


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(relative.parts)
        if parts[1] == "pb":
            continue  # generated
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def imports_of(path: Path, name: str) -> set[str]:
    """Every antwort_grpc module this file imports: at the top, in functions, for type checking."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("antwort_grpc"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base.startswith("antwort_grpc"):
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names)
    return found


def graph() -> dict[str, set[str]]:
    known = dict(modules())
    edges: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = {t for t in imports_of(path, name) if t in known and t != name}
        edges[name] = {t for t in targets if not name.startswith(t + ".")}  # a package's own __init__
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_no_function_of_the_core_or_its_doors_is_above_complexity_15() -> None:
    paths = [ROOT / "gateway.py", ROOT / "core.py", ROOT / "edge.py"]
    for folder in ("engine", "responses", "durable", "front", "server", "http"):
        paths += sorted((ROOT / folder).glob("*.py"))
    over = []
    for path in paths:
        for block in cc_visit(path.read_text()):
            if block.complexity > MAX_COMPLEXITY:
                over.append(f"{path.relative_to(ROOT.parent)}:{block.lineno} {block.name} ({block.complexity})")
    assert not over, over


def test_no_module_imports_a_module_that_imports_it_back() -> None:
    assert cycles(graph()) == []


def test_packages_form_layers_no_import_runs_back_up() -> None:
    packages: dict[str, set[str]] = {}
    for module, targets in graph().items():
        here = package_of(module)
        packages.setdefault(here, set()).update(package_of(t) for t in targets if package_of(t) != here)
    assert cycles(packages) == []


def test_the_check_finds_a_cycle_when_there_is_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_graph_holds_the_imports_it_checks() -> None:
    edges = graph()
    assert "antwort_grpc.engine.run" in edges["antwort_grpc.engine.loop"]
    assert "antwort_grpc.engine.turn" in edges["antwort_grpc.engine.loop"]
    # Imports inside functions count too (a lazy import is still an arrow).
    assert "antwort_grpc.providers.factory" in edges["antwort_grpc.core"]


def reachable(edges: dict[str, set[str]], start: str) -> dict[str, str]:
    """Every module `start` imports, directly or through others: module -> the module importing it."""
    via: dict[str, str] = {}
    todo = [start]
    while todo:
        here = todo.pop()
        for target in edges.get(here, ()):
            if target not in via and target != start:
                via[target] = here
                todo.append(target)
    return via


def test_the_tool_programs_load_nothing_of_the_gateways_server_or_auth_packages() -> None:
    """An executor (sandbox, MCP bridge, your own) is a program of its own: what it shares with the
    gateway (TLS from PEM files, the bearer check) lives below both."""
    edges = graph()
    gateway_only = ("antwort_grpc.server", "antwort_grpc.auth")
    found = []
    for module in sorted(m for m in edges if m.startswith("antwort_grpc.tool_services")):
        via = reachable(edges, module)
        for target in sorted(t for t in via if t.startswith(gateway_only)):
            chain = [target]
            while chain[-1] in via:
                chain.append(via[chain[-1]])
            found.append(" <- ".join(chain))
    assert not found, found[:5]


# What a door may not reach: the core's parts behind its front (admission and observation live in
# the edge and observability, runs in the engine and the responses layer, stores in storage).
BEHIND_THE_FRONT = ("edge", "observability", "engine", "responses", "storage", "hooks")
DOORS = ("server", "http")


def test_a_door_only_adapts_it_reaches_the_core_through_its_front_alone() -> None:
    reached = []
    for name, path in modules():
        if name.count(".") == 0 or name.split(".")[1] not in DOORS:
            continue
        for target in imports_of(path, name):
            parts = target.split(".")
            if len(parts) > 1 and parts[1] in BEHIND_THE_FRONT:
                reached.append(f"{name} imports {target}")
    assert reached == []


def test_no_door_calls_admission_or_observation() -> None:
    words = ("admission", ".reserve(", ".saw(", "edge.", "observer", "Watch", "Reservation", "front.responses")
    found = []
    for folder in DOORS:
        for path in sorted((ROOT / folder).glob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if not code.strip().startswith(('"', "'")) and any(word in code for word in words):
                    found.append(f"{path.relative_to(ROOT.parent)}:{number}: {line.strip()}")
    assert found == []


def test_no_door_builds_or_closes_the_core() -> None:
    """The process root (gateway.py) builds the core, opens the doors and owns shutdown."""
    found = []
    for folder in DOORS:
        for path in sorted((ROOT / folder).glob("*.py")):
            for call in ("build_core(", "assemble(", "core.close(", "parts.close(", "hand_over("):
                if call in path.read_text():
                    found.append(f"{path.relative_to(ROOT.parent)}: {call}")
    assert found == []


# -- the run owns its state ---------------------------------------------------------------------------

RUN_MODULE = "antwort_grpc.engine.run"
INBOX_MODULE = "antwort_grpc.engine.inbox"
# In-place changes of a container or a message, as good as an assignment.
MUTATORS = frozenset(
    {"append", "extend", "insert", "remove", "pop", "popleft", "clear", "update", "setdefault", "add", "discard"}
    | {"CopyFrom", "MergeFrom", "Clear", "ClearField"}
)


def _annotated_run(annotation: ast.expr | None) -> bool:
    """`Run`, `"Run"`, `Run | None` and the like."""
    if annotation is None:
        return False
    return any(
        (isinstance(n, ast.Name) and n.id == "Run") or (isinstance(n, ast.Constant) and n.value == "Run")
        for n in ast.walk(annotation)
    )


def _run_names(tree: ast.AST) -> set[str]:
    """The names a module gives Runs: `run`, and every parameter or variable annotated as one."""
    names = {"run"}
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and _annotated_run(node.annotation):
            names.add(node.arg)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and _annotated_run(node.annotation):
            names.add(node.target.id)
    return names


def _is_run(node: ast.expr, names: set[str]) -> bool:
    """A Run, by its name: `run`, `self.run`, a name annotated as a Run."""
    if isinstance(node, ast.Name):
        return node.id in names
    return isinstance(node, ast.Attribute) and node.attr in names


def _inside_a_run(target: ast.expr, names: set[str]) -> bool:
    """Whether `target` is an attribute or item of a Run (at any depth): `run.x`, `self.run.x.y[0]`."""
    node = target
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
        if _is_run(node, names):
            return True
    return False


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        found: list[ast.expr] = []
        for target in node.targets:
            found += list(target.elts) if isinstance(target, ast.Tuple | ast.List) else [target]
        return found
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    if isinstance(node, ast.Delete):
        return list(node.targets)
    return []


def _private(attribute: str) -> bool:
    return attribute.startswith("_") or attribute == "inbox"


def run_state_writes(source: str, where: str) -> list[str]:
    """Where `source` writes a Run's state: assigns (or deletes) an attribute or item of a Run,
    changes one of its containers or messages in place, reads a private attribute of a Run, or
    reaches its inbox."""
    tree = ast.parse(source)
    names = _run_names(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        for target in _targets(node):
            if _inside_a_run(target, names):
                found.append(f"{where}:{node.lineno} assigns {ast.unparse(target)}")
        func = node.func if isinstance(node, ast.Call) else None
        if isinstance(func, ast.Attribute) and func.attr in MUTATORS and _inside_a_run(func.value, names):
            found.append(f"{where}:{node.lineno} changes {ast.unparse(func)}")
        if isinstance(node, ast.Attribute) and _private(node.attr) and _is_run(node.value, names):
            found.append(f"{where}:{node.lineno} reaches {ast.unparse(node)}")
        if isinstance(node, ast.ImportFrom) and node.module == INBOX_MODULE:
            found.append(f"{where}:{node.lineno} imports the inbox")
    return found


def test_nothing_outside_the_run_writes_its_state() -> None:
    """docs/engine.md, "The run owns its state": only engine/run.py (and the inbox it holds) write
    a Run's fields and its inbox; everything else calls the run's verbs."""
    found = []
    for name, path in modules():
        if name in (RUN_MODULE, INBOX_MODULE):
            continue
        source = path.read_text()
        if RUN_MODULE in imports_of(path, name) or INBOX_MODULE in imports_of(path, name):
            found += run_state_writes(source, str(path.relative_to(ROOT.parent)))
    assert not found, found


def test_the_check_finds_writes_of_a_runs_state() -> None:
    source = """
from antwort_grpc.engine.inbox import Inbox
from antwort_grpc.engine.run import Run

class Step:
    def __init__(self, run: Run) -> None:
        self.run = run

    def go(self, other: Run | None) -> None:
        self.run.deadline = 1.0
        other.recovery, x = [], 2
        self.run.inbox.awaiting[call_id] = request
        run.response.usage.output_tokens += 3
        run.context.append(item)
        run._inbox.stop("x")
        del run.durable
"""
    found = run_state_writes(source, "sample.py")
    described = "\n".join(found)
    for expected in (
        "imports the inbox",
        "assigns self.run.deadline",
        "assigns other.recovery",
        "assigns self.run.inbox.awaiting[call_id]",
        "assigns run.response.usage.output_tokens",
        "changes run.context.append",
        "reaches run._inbox",
        "assigns run.durable",
        "reaches self.run.inbox",
    ):
        assert expected in described, (expected, described)
    assert "self.run = run" not in described, "a step keeping its run writes its own field"


def test_the_engine_never_asks_whether_hooks_are_configured() -> None:
    """Every run has a hook gate (a no-op one without hooks): the loop asks it at each point."""
    found = []
    for path in sorted((ROOT / "engine").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(isinstance(op, ast.Is | ast.IsNot) for op in node.ops):
                named = [
                    n.id if isinstance(n, ast.Name) else n.attr
                    for n in (node.left, *node.comparators)
                    if isinstance(n, ast.Name | ast.Attribute)
                ]
                if "hooks" in named:
                    found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {ast.unparse(node)}")
    assert not found, found
