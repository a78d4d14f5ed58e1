"""docs/reference/ is what docs/gen.py makes of the code today (else: run `make docs`),
and what gen.py reads from the source agrees with the running objects."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from fnrt.functions import errors
from fnrt.runtime.http import problems
from fnrt.tracing.metrics import FunctionState, Metrics

ROOT = Path(__file__).resolve().parents[2]


def _gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fnrt_docs_gen", ROOT / "docs" / "gen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_reference_pages_are_what_the_code_says() -> None:
    stale = [
        path.relative_to(ROOT).as_posix()
        for path, text in _gen().pages().items()
        if not path.exists() or path.read_text() != text
    ]
    assert stale == [], f"stale: {stale}; run `make docs` and commit docs/reference/"


def test_the_status_table_read_from_source_is_the_one_the_server_uses() -> None:
    read = _gen()._status_table()
    assert read == [(cls.__name__, status) for cls, status in problems._STATUS]
    assert all(isinstance(getattr(errors, name), type) for name, _ in read)


def test_every_series_the_registry_serves_is_in_the_table() -> None:
    metrics = Metrics(gpu=False)
    metrics.watch(lambda: [FunctionState("f", "v-1", 1, 0)])
    metrics.watch_store(lambda: {"get": 1})
    metrics.watch_jobs(lambda: {"f": 1}, lambda: 0)
    metrics.watch_spares(lambda: 0, lambda: 0)
    served = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in metrics.registry.collect()
        if family.name.startswith("fnrt_")
    }
    listed = {name for name, *_ in _gen().metric_series()}
    assert served and served <= listed, served - listed
