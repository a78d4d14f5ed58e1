"""docs/edge.md's Python example, run as written against the cnn-split example."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

from support import live_server

DOC = Path(__file__).resolve().parents[2] / "docs" / "edge.md"


def test_the_edge_client_example_runs(
    tmp_path: Path, cnn: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (code,) = [
        b
        for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
        if b.startswith("# edge_client.py")
    ]
    monkeypatch.chdir(tmp_path)  # its cache folder lands here
    with live_server(tmp_path) as srv:
        srv.deploy(cnn)
        script = tmp_path / "edge_client.py"
        script.write_text(code.replace("http://fnrt:8000", srv.url))
        capsys.readouterr()
        runpy.run_path(str(script))
    printed = capsys.readouterr().out
    assert re.search(r"\]\] \d \d+\.\d+", printed), printed
    assert (tmp_path / "edge-cache" / "heads").is_dir()
