"""docs/gen.py, the script that writes docs/reference/, loaded as a module for the docs' tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def docs_gen() -> ModuleType:
    """docs/gen.py as a module (a script: no package imports it), loaded afresh."""
    spec = importlib.util.spec_from_file_location("fnrt_docs_gen", ROOT / "docs" / "gen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
