"""``fnrt serve`` as a user runs it: a separate process, flags and FNRT_* variables."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import click
import httpx
import pytest

from fnrt.runtime.cli.main import main
from fnrt.runtime.cli.options import Duration, Size
from fnrt.runtime.cli.serve import serve, server_settings
from fnrt.runtime.settings import ServerSettings
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
    assert main(["serve", "--trace-protocol", "grpc"]) == 2
    err = capsys.readouterr().err
    assert err.endswith(
        "Error: Invalid value for '--trace-protocol': 'grpc' is not 'http/protobuf'.\n"
    )
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    port = str(free_port())
    assert main(["serve", "--store", str(tmp_path / "store"), "--port", port]) == 2
    out, err = capsys.readouterr()
    assert err == "error: protocol: must be one of ['http/protobuf'], got 'grpc'\n", err
    assert out == "" and not (tmp_path / "store").exists()


def settings_of(*argv: str) -> ServerSettings:
    """The settings ``fnrt serve ARGV`` would run with, under this process's variables."""
    return server_settings(serve.make_context("serve", list(argv)).params)


def test_sizes_and_durations_take_units_as_flags_and_variables(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FNRT_MAX_BODY_BYTES", "1 MiB")
    monkeypatch.setenv("FNRT_SHUTDOWN_TIMEOUT_S", "2m")
    settings = settings_of("--memory-budget-bytes", "2GiB", "--body-timeout-s", "250ms")
    assert settings.memory_budget_bytes == 2 << 30 and settings.body_timeout_s == 0.25
    assert settings.max_body_bytes == 1 << 20 and settings.shutdown_timeout_s == 120
    assert main(["serve", "--disk-cache-bytes", "2Gx"]) == 2
    assert "'2Gx' is not a size" in capsys.readouterr().err
    monkeypatch.setenv("FNRT_DISK_CACHE_BYTES", "lots")
    assert main(["serve"]) == 2  # the variable is named with the flag, in one line
    assert (
        "Invalid value for '--disk-cache-bytes' (env var: 'FNRT_DISK_CACHE_BYTES'): "
        "'lots' is not a size" in capsys.readouterr().err
    )


#: A value each kind of option takes, unlike its default.
def _value_for(option: click.Option, tmp_path: Path) -> tuple[str, object]:
    """(what the variable says, what the setting becomes) for one ``fnrt serve`` option."""
    kind = option.type
    if option.is_flag:
        default = bool(option.default)
        return ("0" if default else "1"), not default
    if isinstance(kind, Size):
        return "3MiB", 3 << 20
    if isinstance(kind, Duration):
        return "1500ms", 1.5
    if isinstance(kind, click.Choice):
        choice = next(c for c in kind.choices if c != option.default)
        return str(choice), choice
    if isinstance(kind, click.Path):
        return str(tmp_path / "f"), tmp_path / "f"
    if kind is click.INT:
        return "1234", 1234
    if isinstance(kind, (click.FloatRange, type(click.FLOAT))):
        return "1234.5", 1234.5
    return "text-value", "text-value"


def test_every_setting_is_an_option_with_its_variable_declared_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    internal = {"sweep_interval_s", "s3_region", "s3_part_size_bytes", "s3_concurrency", "trace"}
    options = {p.name: p for p in serve.params if isinstance(p, click.Option)}
    fields = {f.name for f in dataclasses.fields(ServerSettings)} - internal
    assert fields <= set(options), fields - set(options)
    special = {"admin_token_file", "cors_origins", "insecure_open_admin", "worker_imports"}
    for name in fields - {"port"} - special:
        option = options[name]
        assert option.envvar == f"FNRT_{name.upper()}" and option.show_envvar, name
        text, expected = _value_for(option, tmp_path)
        if name == "host":
            text, expected = "127.0.0.2", "127.0.0.2"
        if name == "device":  # a list of GPUs (checked at start against what is visible)
            text, expected = "cuda:1,cuda:3", "cuda:1,cuda:3"
        if name in ("ssl_certfile", "ssl_keyfile"):  # one needs the other
            monkeypatch.setenv("FNRT_SSL_CERTFILE", text)
            monkeypatch.setenv("FNRT_SSL_KEYFILE", text)
        if name == "max_json_body_bytes":
            text, expected = "2KiB", 2048
        if name == "job_retention_s":  # 0 or at least an hour
            text, expected = "2h", 7200.0
        with monkeypatch.context() as env:
            env.setenv(option.envvar, text)
            assert getattr(settings_of(), name) == expected, name
            flag = option.opts[0]
            given = [] if option.is_flag and expected is False else [flag]
            if option.secondary_opts and expected is False:
                given = option.secondary_opts[:1]
            args = given if option.is_flag else [flag, text]
        monkeypatch.delenv("FNRT_SSL_CERTFILE", raising=False)
        monkeypatch.delenv("FNRT_SSL_KEYFILE", raising=False)
        if name in ("ssl_certfile", "ssl_keyfile"):
            continue
        assert getattr(settings_of(*args), name) == expected, name  # the flag, the same
    for name in special:
        assert options[name].envvar == f"FNRT_{name.upper()}"
    token = tmp_path / "token"
    token.write_text("from-a-file\n")
    monkeypatch.setenv("FNRT_ADMIN_TOKEN_FILE", str(token))
    monkeypatch.setenv("FNRT_CORS_ORIGINS", "https://a.example/, https://b.example")
    monkeypatch.setenv("FNRT_WORKER_IMPORTS", "torch, onnxruntime,")
    settings = settings_of()
    assert settings.admin_token == "from-a-file"
    assert settings.cors_origins == ("https://a.example", "https://b.example")
    assert settings.worker_imports == ("torch", "onnxruntime")
    assert settings_of("--worker-imports", "numpy").worker_imports == ("numpy",)
    with pytest.raises(ValueError, match="worker_imports: 'os; rm' is not a module name"):
        settings_of("--worker-imports", "os; rm")
    with pytest.raises(ValueError, match="spare_workers: must be >= 0"):
        settings_of("--spare-workers", "-1")
    with pytest.raises(ValueError, match="give one, not both"):
        settings_of("--admin-token", "x")
    monkeypatch.setenv("FNRT_PORT", "8123")
    assert settings_of().port == 8123 and settings_of("--port", "8124").port == 8124
