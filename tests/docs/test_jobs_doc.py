"""docs/jobs.md, run as written against the mlp example: its commands and its Python."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fnrt.runtime.cli.main import main
from support import live_server

DOC = Path(__file__).resolve().parents[2] / "docs" / "jobs.md"


def block(first_line: str) -> str:
    for body in re.findall(r"```\w*\n(.*?)```", DOC.read_text(), flags=re.S):
        if body.startswith(first_line):
            return str(body)
    raise AssertionError(f"jobs.md has no block starting {first_line!r}")


def test_the_commands_and_the_client_example_run(
    built: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = block("python -c")
    maker = text.split('"\n', 1)[1].split('\n"', 1)[0]  # the script inside python -c "..."
    commands = [line for line in text.splitlines() if line.startswith("fnrt ")]
    monkeypatch.chdir(tmp_path)
    subprocess.run([sys.executable, "-c", maker], check=True)
    assert len(Path("records.jsonl").read_text().splitlines()) == 10_000
    with live_server(tmp_path, job_poll_interval_s=0.1) as srv:
        s = ["--server", srv.url, "-q"]
        assert main(["deploy", str(built / "mlp"), *s]) == 0
        submit = shlex.split(commands[0].split("#")[0])[1:]
        assert submit[:2] == ["job", "submit"]
        capsys.readouterr()
        assert main([*submit, "--server", srv.url]) == 0
        out = capsys.readouterr().out
        job_id = out.split()[1].rstrip(":")
        assert "10000 of 10000 done, 0 failed" in out
        for line in commands[1:]:
            argv = shlex.split(line.split("#")[0].replace("JOB_ID", job_id))[1:]
            if argv[1] == "cancel":
                continue  # the job has ended: cancel is a 409, shown in test_job_cli
            assert main([*argv, "--server", srv.url]) == 0, argv
        assert len(Path("results.jsonl").read_text().splitlines()) == 10_000

        code = block("import numpy as np").replace("http://127.0.0.1:8000", srv.url)
        scope: dict[str, object] = {}
        exec(compile(code, "jobs.md", "exec"), scope)
        status = scope["status"]
        assert isinstance(status, dict) and status["state"] == "done"
        assert status["progress"]["records_done"] == 2000
        with srv.client() as c:
            x = scope["records"][-1]["x"]  # type: ignore[index]
            invoked = c.post("/v1/functions/mlp/invoke", json={"x": x.tolist()}).json()["y"]
        np.testing.assert_allclose(scope["y"], invoked, rtol=1e-5, atol=1e-6)
