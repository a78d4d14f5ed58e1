"""Set-up from OTEL_* variables, and spans exported over OTLP to a collector on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import orjson
import pytest

from fnrt.runtime.cli.main import main
from fnrt.tracing.setup import TraceConfig, build_tracer, trace_config_from_env
from support import OtlpCollector, free_port, wait_until, write_function


def test_config_from_the_standard_variables() -> None:
    env = {
        "OTEL_SERVICE_NAME": "edge-gw",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.25",
    }
    config = TraceConfig(**trace_config_from_env(env))  # type: ignore[arg-type]
    assert config == TraceConfig(
        exporter="otlp",
        service_name="edge-gw",
        endpoint="http://127.0.0.1:4318",
        sampler="parentbased_traceidratio",
        sampler_ratio=0.25,
    )
    assert config.enabled
    assert TraceConfig(**trace_config_from_env({})) == TraceConfig()  # type: ignore[arg-type]
    assert build_tracer(TraceConfig()) is None  # off unless asked
    with pytest.raises(ValueError, match="protocol"):
        TraceConfig(exporter="otlp", protocol="grpc")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "exporter"),
        ({"OTEL_TRACES_SAMPLER": "sometimes"}, "sampler"),
        ({"OTEL_TRACES_SAMPLER_ARG": "half"}, "OTEL_TRACES_SAMPLER_ARG"),
        ({"OTEL_TRACES_SAMPLER_ARG": "1.5"}, "sampler_ratio"),
    ],
)
def test_bad_settings_name_what_is_wrong(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TraceConfig(**trace_config_from_env(env))  # type: ignore[arg-type]


def spans_received(collector: OtlpCollector) -> list[tuple[str, str, bytes, bytes]]:
    """(service, span name, trace id, parent span id) of everything exported so far."""
    return [
        (service, span.name, span.trace_id, span.parent_span_id)
        for service, span in collector.spans()
    ]


def test_serve_and_invoke_export_one_trace_over_otlp(
    tmp_path: Path, collector: OtlpCollector, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    env = os.environ | {"OTEL_SERVICE_NAME": "fnrt-test", "OTEL_BSP_SCHEDULE_DELAY": "100"}
    argv = [sys.executable, "-m", "fnrt.runtime.cli.main", "serve", "--port", str(port)]
    argv += ["--store", str(tmp_path / "store"), "--cache-dir", str(tmp_path / "cache")]
    argv += ["--trace", "otlp", "--trace-endpoint", collector.url, "--log-level", "warning"]
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr or []), daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(url), 60)
        folder = write_function(tmp_path / "src", "echo")
        assert main(["deploy", str(folder), "--server", url, "-q"]) == 0
        client_env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url}
        with pytest.MonkeyPatch.context() as mp:
            for k, v in client_env.items():
                mp.setenv(k, v)
            assert (
                main(["invoke", "echo", "--json", '{"x": [[1, 2, 3, 4]]}', "-v", "--server", url])
                == 0
            )
        trace_id = capsys.readouterr().err.split("trace ")[-1].strip()
        assert len(trace_id) == 32
        wanted = {"fnrt invoke echo", "POST /v1/functions/{name}/invoke", "queue", "load"}
        wait_until(lambda: wanted <= {s[1] for s in spans_received(collector)}, 30)
        in_trace = [s for s in spans_received(collector) if s[2].hex() == trace_id]
        services = {name: service for service, name, _, _ in in_trace}
        assert services["fnrt invoke echo"] == "fnrt-cli"
        assert services["POST /v1/functions/{name}/invoke"] == "fnrt-test"
        assert {"queue", "load", "encode"} <= set(services)
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    access = [orjson.loads(line) for line in lines if '"logger":"fnrt.access"' in line]
    assert access and access[-1]["function"] == "echo" and access[-1]["trace_id"] == trace_id


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz").status_code == 200
    except httpx.TransportError:
        return False
