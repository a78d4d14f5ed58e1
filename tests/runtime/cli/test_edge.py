"""``fnrt edge run`` and ``fnrt edge plan`` against a live server."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from fnrt.runtime.cli.main import main
from support import live_server


def test_edge_run_and_plan(tmp_path: Path, cnn: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x = np.random.default_rng(2).random((1, 3, 32, 32), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    session = ort.InferenceSession(str(cnn / "model.onnx"), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": x})[0]
    cache = ("--cache-dir", str(tmp_path / "edge"))
    with live_server(tmp_path) as srv:
        srv.deploy(cnn)
        s = ("--server", srv.url, *cache)
        code = main(["edge", "run", "cnn-split", "-i", f"x={tmp_path / 'x.npy'}", "-v", *s])
        out, err = capsys.readouterr()
        assert code == 0, err
        np.testing.assert_allclose(json.loads(out)["y"], expected, atol=1e-5)
        assert "split" in err and "MB/s" in err
        # every millisecond of the first call is accounted for, planning first
        total, parts = re.search(r": ([\d.]+) ms = (.*?)(?: \(server|$)", err, re.M).groups()
        named = dict(part.rsplit(" ", 1) for part in parts.split(", "))
        assert list(named)[:2] == ["plan", "head"] and float(named["plan"]) > 0, err
        assert abs(sum(map(float, named.values())) - float(total)) < 0.05 * len(named) + 0.01
        given = ("--json", json.dumps({"x": x.tolist()}), "-o", str(tmp_path / "y.npz"))
        code = main(["edge", "run", "cnn-split", *given, "--split", "3", "--encoding", "int8", *s])
        assert code == 0
        with np.load(tmp_path / "y.npz") as saved:
            assert np.abs(saved["y"] - expected).max() < 0.05 * max(np.abs(expected).max(), 1)
        capsys.readouterr()
        slow = ("--emulate-bandwidth", "20000", "--emulate-rtt-ms", "5", "--emulate-slowdown", "2")
        code = main(["edge", "plan", "cnn-split", *slow, *s])
        out, err = capsys.readouterr()
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0].startswith("cnn-split v-") and "MB/s" in lines[0]
        assert len(lines) == 2 + 8 and sum("<- planned" in line for line in lines) == 1
        assert "after.5" in out and "(all here)" in out
        code = main(["edge", "plan", "cnn-split", "--split", "2", *slow, *s])
        out, err = capsys.readouterr()
        assert code == 0, err  # the split given is the one marked, not the planner's
        marked = [line for line in out.splitlines() if "<-" in line]
        assert len(marked) == 1 and marked[0].split()[0] == "2" and "--split" in marked[0]
    # the server is gone: the whole model runs here from the cache
    code = main(["edge", "run", "cnn-split", "-i", f"x={tmp_path / 'x.npy'}", "-v", *s])
    out, err = capsys.readouterr()
    assert code == 0 and "offline" in err
    np.testing.assert_allclose(json.loads(out)["y"], expected, atol=1e-5)
    code = main(["edge", "run", "cnn-split", "-i", f"x={tmp_path / 'x.npy'}",
                 "--server", srv.url, "--cache-dir", str(tmp_path / "empty")])  # fmt: skip
    assert code == 1 and "cannot reach the server" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["run", "plan"])
def test_edge_commands_have_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["edge", command, "--help"]) == 0
    assert "--emulate-bandwidth" in capsys.readouterr().out


def test_plan_of_a_function_without_splits_names_it_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # was: "function 'echo': function 'echo': has no split points"
    from support import write_function

    folder = write_function(tmp_path / "src", "echo")
    with live_server(tmp_path) as srv:
        srv.deploy(folder)
        cache = ("--cache-dir", str(tmp_path / "edge"))
        assert main(["edge", "plan", "echo", "--server", srv.url, *cache]) == 1
        err = capsys.readouterr().err
        assert err.count("function 'echo'") == 1 and "has no split points" in err, err


@pytest.mark.parametrize(
    "option", [("--split", "-1"), ("--threads", "0"), ("--emulate-slowdown", "0.5")]
)
def test_an_option_out_of_range_is_a_usage_error(
    option: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["edge", "plan", "cnn-split", *option, "--server", "http://127.0.0.1:9"])
    err = capsys.readouterr().err
    assert code == 2 and "Error: " in err and "must be" in err  # click's usage error
    assert "Traceback" not in err
