"""docs/oip.md's tritonclient example, run as written against the mlp example."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

from fnrt.runtime.cli.main import main
from support import live_server

DOC = Path(__file__).resolve().parents[2] / "docs" / "oip.md"


def test_the_tritonclient_example_runs(
    tmp_path: Path, built: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (code,) = [
        b
        for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
        if "# oip_client.py" in b
    ]
    with live_server(tmp_path) as srv:
        assert main(["deploy", str(built / "mlp"), "--server", srv.url, "--quiet"]) == 0
        script = tmp_path / "oip_client.py"
        script.write_text(code.replace("127.0.0.1:8000", srv.url.removeprefix("http://")))
        capsys.readouterr()
        runpy.run_path(str(script))
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "[{'name': 'x', 'datatype': 'FP32', 'shape': [-1, 64]}]"
    assert printed[1] == "(2, 10)"
    assert re.fullmatch(r"v-[0-9a-f]{12}", printed[2])
