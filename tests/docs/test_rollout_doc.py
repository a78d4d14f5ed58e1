"""docs/rollout.md's walkthrough, run as written against a real server."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fnrt.runtime.cli.main import main
from support import live_server

DOC = Path(__file__).resolve().parents[2] / "docs" / "rollout.md"


def walkthrough() -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", DOC.read_text(), flags=re.S)
    return [line for line in blocks[0].splitlines() if line.strip()]


def test_walkthrough(built: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with live_server(tmp_path) as srv:
        assert main(["deploy", str(built / "mlp"), "--server", srv.url]) == 0
        first = srv.call(srv.registry.get("mlp")).version.version
        capsys.readouterr()
        for line in walkthrough():
            line = line.replace("/tmp/mlp-v2", str(tmp_path / "mlp-v2"))
            line = line.replace("examples/mlp", str(built / "mlp"))
            argv = shlex.split(line)
            if argv[0] == "cp":
                shutil.copytree(argv[-2], argv[-1])
            elif argv[0] == ".venv/bin/python":
                subprocess.run([sys.executable, *argv[1:]], check=True)
            else:
                assert argv[0] == "fnrt"
                assert main([*argv[1:], "--server", srv.url]) == 0, line
        out = capsys.readouterr().out
        assert "canary started" in out
        assert "rollout: canary to v-" in out and "running at 10%" in out
        assert "rolled_back (rolled back by hand)" in out
        routing, _ = srv.node.repository.get_routing("mlp")
        assert routing.traffic == {first: 100}
