"""Which installed packages a handler's code imports: what a spare worker may import ahead.

Two ways to know. A load reports what it imported (:func:`fnrt.loader.worker.
installed_imports`), but only once it has run: a node's first cold start pays
for its worker's imports (torch: about a second). A version's code can also be
read without running it (:func:`code_imports`): its ``import`` statements name
the packages. They are read once, when the version is deployed, and kept with
it (``VersionManifest.imports``), so that a node learns them when it first
reads the version: at a deploy, or when it starts on a store with functions in
it. Each node imports ahead those of them that it has installed
(:func:`installed`): a deploy may run elsewhere (``fnrt deploy --store`` on a
laptop) with other packages.

Either way, only top-level names of modules that live in the installed packages
(site-packages) count: not the standard library (a spare has the little of it
that matters), not fnrt (a worker imports it anyway), and never a name the
function's own code provides, which a module imported ahead from elsewhere
would shadow.
"""

from __future__ import annotations

import ast
import functools
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path

from fnrt.functions.version import MAX_IMPORTS

#: The most bytes of source read for imports at a deploy: enough for a handler and
#: its modules; a bundle of vendored code beyond it is not read (its imports are a
#: hint, and a load reports what it really imported).
MAX_SCAN_BYTES = 2 * 1024 * 1024


@functools.cache
def site_roots() -> frozenset[str]:
    """Where installed packages live (asked once: ``sysconfig`` is slow to answer)."""
    return frozenset(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))


def from_site(path: str, also: Iterable[str] = ()) -> bool:
    """Whether the file or folder at ``path`` lies in the installed packages (or in the
    folders ``also`` names: an ``[environment]``'s)."""
    where = os.path.abspath(path)
    return any(where.startswith(root + os.sep) for root in (*site_roots(), *also))


@functools.lru_cache(maxsize=1024)
def installed(name: str) -> bool:
    """Whether top-level module ``name`` would be imported from the installed packages
    (found without importing it)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a finder that raises for an odd name
        return False
    if spec is None:
        return False
    if spec.origin not in (None, "namespace", "built-in", "frozen"):
        return from_site(spec.origin)
    return any(from_site(p) for p in spec.submodule_search_locations or ())


def installed_in(name: str, site: Path) -> bool:
    """Whether top-level module ``name`` is in the packages at ``site`` (an
    ``[environment]``'s folder; found without importing it)."""
    try:
        return importlib.machinery.PathFinder.find_spec(name, [str(site)]) is not None
    except (ImportError, ValueError):
        return False


def imported_names(source: str) -> set[str]:
    """The top-level names a module's absolute ``import`` statements name, anywhere in
    it (a handler often imports its framework inside ``load``); none if it does not
    parse (its import will say why)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # ValueError: a null byte in the source
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


def _sources(code_dir: Path, first: str) -> Iterable[Path]:
    """The bundle's Python files, the handler's module ``first`` (dotted) before the
    rest, in a stable order; nothing under ``__pycache__``."""
    handler = code_dir.joinpath(*first.split(".")).with_suffix(".py")
    rest = sorted(p for p in code_dir.rglob("*.py") if "__pycache__" not in p.parts)
    return [handler, *(p for p in rest if p != handler)] if handler in rest else rest


def own_names(code_dir: Path) -> set[str]:
    """The top-level names the function's code provides (``name.py``, ``name/``)."""
    return {
        p.stem if p.suffix == ".py" else p.name
        for p in code_dir.iterdir()
        if p.suffix == ".py" or (p.is_dir() and p.name != "__pycache__")
    }


def code_imports(code_dir: Path, handler_module: str) -> tuple[str, ...]:
    """The packages the unpacked code at ``code_dir`` imports, sorted (at most
    ``MAX_IMPORTS``): not the standard library, fnrt or its own modules, read from up to
    :data:`MAX_SCAN_BYTES` of its source, the handler's module ``handler_module`` first.
    Whether each is installed is for the node that imports it ahead to say."""
    names: set[str] = set()
    left = MAX_SCAN_BYTES
    for path in _sources(code_dir, handler_module):
        size = path.stat().st_size
        if size > left:
            break
        left -= size
        names |= imported_names(path.read_text(encoding="utf-8", errors="replace"))
    names -= own_names(code_dir) | sys.stdlib_module_names | {"fnrt"}
    return tuple(sorted(n for n in names if not n.startswith("_"))[:MAX_IMPORTS])
