"""``fnrt serve`` as a user runs it: a separate process, flags and FNRT_* variables."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from fnrt.runtime.cli.main import main
from support import free_port, write_function


def test_serve_process_with_flags_and_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    env = os.environ | {
        "FNRT_STORE": str(tmp_path / "store"),
        "FNRT_ADMIN_TOKEN": "s3cret",
        "FNRT_MAX_BODY_BYTES": "2048",
        "FNRT_REQUEST_LOG_FILE": str(tmp_path / "logs" / "requests.log"),
    }
    argv = [sys.executable, "-m", "fnrt.runtime.cli.main", "serve", "--port", str(port)]
    argv += ["--cache-dir", str(tmp_path / "cache"), "--log-level", "info"]
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # wait for the server to say it listens
            if "Uvicorn running" in line:
                break
        else:
            raise AssertionError(f"fnrt serve exited with {proc.wait()}")
        # keep reading its log, so a full pipe never blocks the server
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        url = f"http://127.0.0.1:{port}"
        folder = write_function(tmp_path / "src", "echo")
        assert main(["deploy", str(folder), "--server", url]) == 1  # no token: refused
        assert "error 401" in capsys.readouterr().err
        assert main(["deploy", str(folder), "--server", url, "--token", "s3cret"]) == 0
        assert (tmp_path / "store" / "functions" / "echo" / "routing.json").is_file()
        r = httpx.post(f"{url}/v1/functions/echo/invoke", json={"x": [[1, 2, 3, 4]]})
        assert r.json() == {"y": [[2, 4, 6, 8]]}
        big = httpx.post(f"{url}/v1/functions/echo/invoke", json={"x": [[1.5, 2, 3, 4]] * 200})
        assert big.status_code == 413 and big.json()["limit_bytes"] == 2048
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    # the request log went to its file, a JSON line per request, none to the terminal
    lines = [json.loads(line) for line in (tmp_path / "logs" / "requests.log").open()]
    assert [line["status"] for line in lines] == [200, 413] and lines[0]["function"] == "echo"


def test_a_busy_port_is_said_first_and_nothing_starts(tmp_path: Path) -> None:
    # was: "serving ... on http://..." and "Application startup complete", then the error
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [sys.executable, "-m", "fnrt.runtime.cli.main", "serve", "--port", str(port)]
        argv += ["--store", str(tmp_path / "store"), "--cache-dir", str(tmp_path / "cache")]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert (
        done.stderr.strip() == f"error: cannot listen on 127.0.0.1:{port}: Address already in use"
    )


def test_a_refused_setting_is_one_line_and_nothing_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # was: --trace-protocol grpc offered, then a traceback from the exporter
    with pytest.raises(SystemExit) as info:
        main(["serve", "--trace-protocol", "grpc"])
    assert info.value.code == 2 and "invalid choice: 'grpc'" in capsys.readouterr().err
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    port = str(free_port())
    assert main(["serve", "--store", str(tmp_path / "store"), "--port", port]) == 2
    out, err = capsys.readouterr()
    assert err == "error: protocol: must be one of ['http/protobuf'], got 'grpc'\n", err
    assert out == "" and not (tmp_path / "store").exists()


def test_sizes_and_durations_take_units_as_flags_and_variables(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fnrt.runtime.cli.main import _server_settings, build_parser

    args = build_parser().parse_args(
        ["serve", "--memory-budget-bytes", "2GiB", "--body-timeout-s", "250ms"]
    )
    monkeypatch.setenv("FNRT_MAX_BODY_BYTES", "1 MiB")
    monkeypatch.setenv("FNRT_SHUTDOWN_TIMEOUT_S", "2m")
    settings = _server_settings(args)
    assert settings.memory_budget_bytes == 2 << 30 and settings.body_timeout_s == 0.25
    assert settings.max_body_bytes == 1 << 20 and settings.shutdown_timeout_s == 120
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["serve", "--disk-cache-bytes", "2Gx"])
    assert info.value.code == 2
    assert "'2Gx' is not a size" in capsys.readouterr().err
    monkeypatch.setenv("FNRT_DISK_CACHE_BYTES", "lots")
    with pytest.raises(ValueError, match=r"^FNRT_DISK_CACHE_BYTES: 'lots' is not a size"):
        _server_settings(args)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib import metadata

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"fnrt {metadata.version('fnrt')}\n"
