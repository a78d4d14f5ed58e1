"""The [isolation] examples of docs/isolation.md and docs/handlers.md are valid manifests,
as written."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from fnrt.functions.manifest import IsolationMode, parse_manifest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("doc", ["docs/isolation.md", "docs/handlers.md"])
def test_the_isolation_examples_parse(doc: str) -> None:
    blocks = [
        b
        for b in re.findall(r"```toml\n(.*?)```", (ROOT / doc).read_text(), flags=re.S)
        if "[isolation]" in b
    ]
    assert blocks, f"{doc} shows no [isolation] example"
    for block in blocks:
        section = block[block.index("[isolation]") :]
        section = re.split(r"\n(?=\[)", section)[0]  # up to the next table
        data = tomllib.loads(section)
        manifest = parse_manifest({"name": "doc", "handler": "handler:H", **data})
        assert manifest.isolation.kind_under() in IsolationMode
