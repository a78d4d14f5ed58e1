"""docs/client.md's Python examples, run as written against the mlp example."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

from fnrt.runtime.cli.main import main
from support import live_server

DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"


def _example(first_line: str) -> str:
    (code,) = [
        b
        for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
        if b.startswith(first_line)
    ]
    return code


def test_the_client_examples_run(
    tmp_path: Path, built: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with live_server(tmp_path) as srv:
        assert main(["deploy", str(built / "mlp"), "--server", srv.url, "--quiet"]) == 0
        capsys.readouterr()
        for name in ("client_example.py", "async_client_example.py"):
            script = tmp_path / name
            script.write_text(_example(f"# {name}").replace("http://127.0.0.1:8000", srv.url))
            runpy.run_path(str(script), run_name="__main__")
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "(2, 10) float32"
    assert re.fullmatch(r"mlp v-[0-9a-f]{12}", printed[1])
    assert printed[2].startswith("422 ") and "'x'" in printed[2]
    assert printed[3] == str([(1, 10)] * 8)
