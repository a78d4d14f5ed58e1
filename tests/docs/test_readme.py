"""The README's tutorial, run as written: its handler, manifest and requests."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import httpx
import numpy as np
import pytest

from fnrt.runtime.cli.main import main
from support import live_server

README = Path(__file__).resolve().parents[2] / "README.md"


def block(first_line: str) -> str:
    """The fenced code block of the README whose first line is ``first_line``."""
    for body in re.findall(r"```\w*\n(.*?)```", README.read_text(), flags=re.S):
        if body.startswith(first_line + "\n"):
            return body
    raise AssertionError(f"README has no block starting {first_line!r}")


def test_tutorial(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hello = tmp_path / "hello"
    hello.mkdir()
    (hello / "handler.py").write_text(block("# hello/handler.py"))
    (hello / "fnrt.toml").write_text(block("# hello/fnrt.toml"))
    np.save(hello / "factor.npy", np.float32(2.5))  # the README's python -c line
    with live_server(tmp_path) as srv:
        assert main(["deploy", str(hello), "--server", srv.url]) == 0
        assert re.fullmatch(r"hello v-[0-9a-f]{12} deployed\n", capsys.readouterr().out)
        r = httpx.post(f"{srv.url}/v1/functions/hello/invoke", json={"x": [[1, 2, 3]]})
        assert r.text == '{"y":[[2.5,5.0,7.5]]}'  # the README's printed answer
        script = tmp_path / "hello_client.py"
        script.write_text(block("# hello_client.py").replace("http://127.0.0.1:8000", srv.url))
        capsys.readouterr()
        runpy.run_path(str(script))
        printed = capsys.readouterr().out.splitlines()
        assert printed[:2] == ["[[2.5 2.5 2.5]", " [2.5 2.5 2.5]]"]
        assert re.fullmatch(r"v-[0-9a-f]{12}", printed[2])
