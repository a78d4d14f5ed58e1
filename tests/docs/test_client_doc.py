"""docs/client.md's Python examples, run as written against the mlp example."""

from __future__ import annotations

import re
import runpy
import shutil
import subprocess
from pathlib import Path

import pytest

from fnrt.runtime.cli.main import main
from support import live_server, write_function

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


HELLO = """
class Hello:
    def __call__(self, batch):
        return [{"y": r["x"] * 2.5} for r in batch]
"""

HELLO_MANIFEST = """
name = "{name}"
handler = "handler:Hello"

[inputs]
x = {{ dtype = "float32", shape = [-1, 3] }}

[outputs]
y = {{ dtype = "float32", shape = [-1, 3] }}
"""


def test_the_javascript_fetch_example_runs(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (the JavaScript example runs where it is)")
    (code,) = re.findall(r"```javascript\n(.*?)```", DOC.read_text(), flags=re.S)
    folder = write_function(tmp_path / "src", "hello", HELLO, HELLO_MANIFEST)
    with live_server(tmp_path) as srv:
        srv.deploy(folder)
        script = tmp_path / "fetch_example.mjs"  # a module: top-level await
        script.write_text(code.replace("http://127.0.0.1:8000", srv.url))
        done = subprocess.run([node, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"\[ \[ 2\.5, 5, 7\.5 \] \] v-[0-9a-f]{12}\n", done.stdout), done.stdout
