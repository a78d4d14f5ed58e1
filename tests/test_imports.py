"""The import graph of the source folders: no cycles, and the one-way direction
docs/architecture.md draws.

Every ``import`` counts, also those under ``TYPE_CHECKING`` and inside
functions: a cycle that only typing or a late import hides is still a cycle
for a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("client", "functions", "loader", "runtime", "edge", "tracing")
#: Which folders each folder may import (docs/architecture.md, "the direction of imports").
ALLOWED = {
    "functions": set(),
    "client": {"functions"},
    "tracing": set(),
    "loader": {"functions", "tracing"},
    "edge": {"functions", "tracing"},
    "runtime": {"client", "functions", "loader", "edge", "tracing"},
}


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return "fnrt." + ".".join(parts)


def _graph() -> dict[str, set[str]]:
    modules = {_module(p): p for f in FOLDERS for p in (ROOT / f).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            found.update(t for t in targets if t in modules and t != name)
        graph[name] = found
    return graph


def test_no_import_cycles() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)


def test_folders_import_one_way() -> None:
    wrong = [
        f"{source} imports {target}"
        for source, targets in _graph().items()
        for target in targets
        if target.split(".")[1] != source.split(".")[1]
        and target.split(".")[1] not in ALLOWED[source.split(".")[1]]
    ]
    assert wrong == []


def test_the_decisions_import_nothing_of_http() -> None:
    graph = _graph()
    decisions = [m for m in graph if m.startswith("fnrt.runtime.") and ".http" not in m]
    decisions = [m for m in decisions if ".cli" not in m]
    wrong = [f"{m} imports {t}" for m in decisions for t in graph[m] if ".http" in t or ".cli" in t]
    assert wrong == []
