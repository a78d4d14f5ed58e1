"""The ``fnrt`` CLI against a live server (and straight to a store)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import numpy as np
import pytest

from fnrt.runtime.cli.main import main
from support import live_server, write_function


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_deploy_invoke_ls_describe_rm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_function(tmp_path / "src", "echo")
    with live_server(tmp_path) as srv:
        s = ("--server", srv.url)
        code, out, _ = run(capsys, "deploy", str(folder), *s)
        assert code == 0
        name, version, word = out.split()
        assert (name, word) == ("echo", "deployed")
        code, out, _ = run(capsys, "deploy", str(folder), "--name", "echo2", "--json", *s)
        assert json.loads(out)["name"] == "echo2"

        code, out, _ = run(capsys, "invoke", "echo", "--json", '{"x": [[1, 2, 3, 4]]}', *s)
        assert (code, json.loads(out)) == (0, {"y": [[2, 4, 6, 8]]})
        np.savez(tmp_path / "in.npz", x=np.ones((2, 4), np.float32))
        np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
        code, out, _ = run(
            capsys, "invoke", "echo", "-i", str(tmp_path / "in.npz"), "--format", "json", *s
        )
        assert json.loads(out) == {"y": [[2, 2, 2, 2]] * 2}
        code, _, err = run(
            capsys,
            "invoke",
            "echo",
            "-i",
            f"x={tmp_path / 'x.npy'}",
            "-o",
            str(tmp_path / "out.npz"),
            "-v",
            *s,
        )
        assert code == 0 and version in err
        np.testing.assert_array_equal(
            np.load(tmp_path / "out.npz")["y"], np.full((1, 4), 2, np.float32)
        )

        code, out, _ = run(capsys, "ls", *s)
        rows = [line.split()[:3] for line in out.splitlines()]
        assert rows[:2] == [["NAME", "VERSION", "STATE"], ["echo", version, "warm"]]
        assert rows[2][0::2] == ["echo2", "cold"]
        code, out, _ = run(capsys, "describe", "echo", *s, "--json")
        assert json.loads(out)["instance"]["requests"] == 3
        code, out, _ = run(capsys, "describe", "echo", *s)
        lines = out.splitlines()
        assert code == 0 and len(lines) < 20, out
        assert lines[0].startswith(f"echo  {version}  warm (1 instance, ")
        assert "  inputs      x float32[-1, 4]" in lines
        assert f"  traffic     {version} 100%" in lines
        assert any(line.startswith("  requests    3 served, 0 errors") for line in lines)
        assert any(line.startswith("  latency     queue p50 ") for line in lines)
        assert any("(keep_alive_s 300)" in line for line in lines), out  # not 300.0
        assert lines[-1] == "(fnrt describe NAME --json for everything)"
        code, out, _ = run(capsys, "describe", "echo2", *s)  # never called: nothing loaded
        assert "  loads       0" in out and "latency" not in out
        assert run(capsys, "rm", "echo2", *s)[:2] == (0, "removed echo2\n")
        assert "echo2" not in run(capsys, "ls", "--json", *s)[1]


def test_cli_errors_are_clear_and_exit_nonzero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_function(tmp_path / "src", "echo")
    toml = folder / "fnrt.toml"
    with live_server(tmp_path) as srv:
        s = ("--server", srv.url)
        code, _, err = run(capsys, "invoke", "nope", "--json", '{"x": 1}', *s)
        assert code == 1 and "error 404: function 'nope' is not deployed" in err
        code, _, err = run(capsys, "invoke", "nope", *s)
        assert code == 1 and "give the inputs" in err

        toml.write_text(toml.read_text().replace("max_batch_size = 8", "max_batch_size = -3"))
        code, _, err = run(capsys, "deploy", str(folder), *s)
        assert code == 1 and "manifest field 'batching.max_batch_size'" in err
        toml.write_text(
            toml.read_text().replace("max_batch_size = -3", "max_batch_size = 8\nmax_batchsize = 3")
        )
        code, _, err = run(capsys, "deploy", str(folder), *s)
        assert code == 1 and "manifest field 'batching.max_batchsize': unknown key" in err
        code, _, err = run(capsys, "deploy", str(tmp_path / "missing"), *s)
        assert code == 1 and "is not a folder" in err

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code, _, err = run(capsys, "ls", "--server", f"http://127.0.0.1:{port}")
    assert code == 1 and "cannot reach the fnrt server" in err


def test_deploy_straight_to_a_store_then_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_function(tmp_path / "src", "echo")
    code, out, _ = run(capsys, "deploy", str(folder), "--store", str(tmp_path / "store"))
    assert code == 0 and out.startswith("echo v-")
    with live_server(tmp_path) as srv, srv.client() as c:
        assert c.post("/v1/functions/echo/invoke", json={"x": [[1, 1, 1, 1]]}).json() == {
            "y": [[2, 2, 2, 2]]
        }


@pytest.mark.parametrize("command", ["serve", "deploy", "invoke", "ls", "describe", "rm"])
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, "--help"]) == 0
    assert "Usage: fnrt " + command in capsys.readouterr().out


BYTES_HANDLER = """
import numpy as np

def handle(batch):
    return [{"s": np.array([b"plain text", b"\\xff\\xfe"], dtype=object)} for _ in batch]
"""
BYTES_MANIFEST = """
name = "{name}"
handler = "handler:handle"

[outputs]
s = {{ dtype = "bytes", shape = [-1] }}
"""


def test_invoke_prints_a_bytes_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # was: TypeError: Object of type bytes is not JSON serializable
    folder = write_function(tmp_path / "src", "texts", BYTES_HANDLER, BYTES_MANIFEST)
    with live_server(tmp_path) as srv:
        assert run(capsys, "deploy", str(folder), "--server", srv.url)[0] == 0
        code, out, _ = run(capsys, "invoke", "texts", "--json", '{"x": [1]}', "--server", srv.url)
        assert code == 0
        assert json.loads(out) == {"s": ["plain text", {"base64": "//4="}]}
