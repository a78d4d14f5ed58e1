"""``fnrt bench-concurrency``: a sweep of a deployed function, from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fnrt.runtime.cli.main import main
from support import write_function


def test_it_prints_each_level_and_the_best(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    folder = write_function(tmp_path / "src", "echo")
    assert main(["deploy", str(folder), "--store", str(store), "--quiet"]) == 0
    capsys.readouterr()
    args = ["bench-concurrency", "echo", "--store", str(store), "--cache-dir", str(tmp_path / "c")]
    quick = ["--levels", "1,2", "--clients", "4", "--warmup-s", "0", "--duration-s", "0.3"]
    assert main([*args, *quick, "--isolation", "thread"]) == 0
    out = capsys.readouterr().out
    assert "instances   requests/s" in out and "best: " in out
    assert main([*args, *quick, "--isolation", "thread", "--json", "--rows", "2"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert [r["level"] for r in figures["results"]] == [1, 2]
    assert figures["best"] in (1, 2)
    assert all(r["errors"] == 0 and r["requests"] > 0 for r in figures["results"])


def test_a_function_that_is_not_there_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["bench-concurrency", "nope", "--store", str(tmp_path / "store"), "--levels", "1"])
    assert code != 0
    assert "nope" in capsys.readouterr().err
