"""The node's parts stay small enough to read whole (#42 item 7): every class in
``runtime/`` has at most 25 methods, and the map's path of one invoke
(``docs/architecture.md``) names at most 8 files.

Methods are the functions a class body defines itself, properties included (nested
helpers of a method do not add to it; inherited ones count for the class that defines
them).
A class over the bound is a coordination hub that should hand a part of its work to
a part of its own (#42 item 7).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "runtime"
MAX_METHODS = 25

#: Classes still over the bound, and the most methods each may have until split: the
#: count may only go down. Keep this list empty where it can be.
NOT_YET: dict[tuple[str, str], int] = {}


def methods_per_class() -> dict[tuple[str, str], int]:
    found = {}
    for path in sorted(RUNTIME.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                count = sum(
                    isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) for item in node.body
                )
                found[(path.relative_to(RUNTIME).as_posix(), node.name)] = count
    return found


def test_no_class_in_runtime_has_more_than_25_methods() -> None:
    counts = methods_per_class()
    assert ("scheduler.py", "Scheduler") in counts  # the walk sees the package
    over = {
        key: count
        for key, count in counts.items()
        if count > max(MAX_METHODS, NOT_YET.get(key, MAX_METHODS))
    }
    assert not over, f"classes over {MAX_METHODS} methods (split them): {over}"


def test_the_request_path_parts_are_within_the_bound() -> None:
    counts = methods_per_class()
    for key in (
        ("scheduler.py", "Scheduler"),
        ("gateway.py", "Gateway"),
        ("intake.py", "Intake"),
        ("batcher.py", "Batcher"),
        ("sequencer.py", "Sequencer"),
    ):
        assert counts[key] <= MAX_METHODS, (key, counts[key])
    assert counts[("scheduler.py", "Scheduler")] <= 8  # a record of parts, and a resident


def test_the_invoke_path_in_the_map_names_at_most_8_files() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## One invoke, end to end", 1)[1]
    diagram = section.split("```", 2)[1]
    files = set(re.findall(r"[\w/]+\.py\b", diagram))
    assert 0 < len(files) <= 8, sorted(files)
