"""docs/reference/ is what docs/gen.py makes of the code today (else: run `make docs`),
and what gen.py reads from the source agrees with the running objects."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from docsupport import docs_gen

from fnrt.functions import errors
from fnrt.runtime.http import problems
from fnrt.runtime.settings import ServerSettings
from fnrt.tracing.metrics import FunctionState, Metrics

ROOT = Path(__file__).resolve().parents[2]


def test_the_reference_pages_are_what_the_code_says() -> None:
    stale = [
        path.relative_to(ROOT).as_posix()
        for path, text in docs_gen().pages().items()
        if not path.exists() or path.read_text() != text
    ]
    assert stale == [], f"stale: {stale}; run `make docs` and commit docs/reference/"


def test_the_status_table_read_from_source_is_the_one_the_server_uses() -> None:
    read = docs_gen()._status_table()
    assert read == [(cls.__name__, status) for cls, status in problems._STATUS]
    assert all(isinstance(getattr(errors, name), type) for name, _ in read)


def test_every_series_the_registry_serves_is_in_the_table() -> None:
    metrics = Metrics(gpu=False)
    metrics.watch(lambda: [FunctionState("f", "v-1", 1, 0)])
    metrics.watch_store(lambda: {"get": 1}, lambda: 0)
    metrics.watch_jobs(lambda: {"f": 1}, lambda: 0)
    metrics.watch_spares(lambda: 0, lambda: 0)
    served = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in metrics.registry.collect()
        if family.name.startswith("fnrt_")
    }
    listed = {name for name, *_ in docs_gen().metric_series()}
    assert served and served <= listed, served - listed


def test_the_cli_page_gives_each_serve_bound_the_settings_check() -> None:
    # `fnrt serve --max-json-body-bytes 1000` exits on a bound --help did not say:
    # the page lists each bound read from the settings' checks, and each one listed
    # is the one a running ServerSettings enforces
    gen = docs_gen()
    bounds = gen.serve_bounds()
    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    for flag in ("max-json-body-bytes", "max-response-bytes", "max-body-bytes", "max-job-bytes"):
        name = flag.replace("-", "_")
        assert bounds[name] == "must be at least 1024", bounds
        row = f"| `--{flag}` | `FNRT_{name.upper()}` | must be at least 1024 |"
        assert row in page, row
        fields = {f.name for f in dataclasses.fields(ServerSettings)}
        assert name in fields
        ServerSettings(**{name: 1024})
        with pytest.raises(ValueError, match=f"^{name}: must be at least 1024$"):
            ServerSettings(**{name: 1023})
    assert bounds["max_tensor_elements"] == "must be at least 1"
    with pytest.raises(ValueError, match=r"^max_tensor_elements: must be at least 1$"):
        ServerSettings(max_tensor_elements=0)  # named as the setting (it said max_elements)
