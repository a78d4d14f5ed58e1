"""OpenTelemetry set-up from the standard ``OTEL_*`` variables (and ``--trace`` flags).

Nothing here runs on import, and nothing is set globally: :func:`build_tracer`
returns a tracer that the server (or a test, with its own in-memory
exporter) passes where spans are made. Spans are fnrt's lean records
(:mod:`fnrt.tracing.recorder`) exported as OTLP over HTTP/protobuf.

Unlike the OpenTelemetry default (``otlp``), fnrt exports nothing unless
asked: ``OTEL_TRACES_EXPORTER`` (or ``fnrt serve --trace``) set to ``otlp``
or ``console`` turns tracing on, so a server never tries to reach a
collector that is not there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fnrt.tracing.export import SpanExporter
    from fnrt.tracing.recorder import Tracer

EXPORTERS = ("none", "console", "otlp")
PROTOCOLS = ("http/protobuf",)
DEFAULT_OTLP_ENDPOINT = "http://localhost:4318"
SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)


@dataclass(frozen=True)
class TraceConfig:
    """Where spans go and how many are kept."""

    exporter: str = "none"
    service_name: str = "fnrt"
    endpoint: str | None = None  # None: the exporter's default (localhost:4318 / 4317)
    protocol: str = "http/protobuf"
    sampler: str = "parentbased_always_on"
    sampler_ratio: float = 1.0

    def __post_init__(self) -> None:
        if self.exporter not in EXPORTERS:
            raise ValueError(f"exporter: must be one of {list(EXPORTERS)}, got {self.exporter!r}")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol: must be one of {list(PROTOCOLS)}, got {self.protocol!r}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler: must be one of {list(SAMPLERS)}, got {self.sampler!r}")
        if not 0.0 <= self.sampler_ratio <= 1.0:
            raise ValueError("sampler_ratio: must be a fraction from 0 to 1")

    @property
    def enabled(self) -> bool:
        return self.exporter != "none"


def trace_config_from_env(env: Mapping[str, str]) -> dict[str, object]:
    """The :class:`TraceConfig` fields the standard variables set (only those present)."""
    found: dict[str, object] = {}
    if "OTEL_TRACES_EXPORTER" in env:
        found["exporter"] = env["OTEL_TRACES_EXPORTER"].split(",")[0].strip().lower()
    if "OTEL_SERVICE_NAME" in env:
        found["service_name"] = env["OTEL_SERVICE_NAME"]
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if endpoint:
        found["endpoint"] = endpoint
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL"
    )
    if protocol:
        found["protocol"] = protocol
    if "OTEL_TRACES_SAMPLER" in env:
        found["sampler"] = env["OTEL_TRACES_SAMPLER"].strip().lower()
    if "OTEL_TRACES_SAMPLER_ARG" in env:
        try:
            found["sampler_ratio"] = float(env["OTEL_TRACES_SAMPLER_ARG"])
        except ValueError:
            raise ValueError(
                f"OTEL_TRACES_SAMPLER_ARG: {env['OTEL_TRACES_SAMPLER_ARG']!r} is not a number"
            ) from None
    return found


def build_tracer(
    config: TraceConfig, exporter: SpanExporter | None = None, *, batch: bool = True
) -> Tracer | None:
    """A tracer exporting to ``exporter`` (or the one ``config`` names); None when off.

    Spans leave through a background batch (off the request path) unless
    ``batch`` is False (tests read them as soon as they end).
    """
    if exporter is None and not config.enabled:
        return None
    from fnrt.tracing.export import BatchExporter
    from fnrt.tracing.recorder import Tracer

    chosen = exporter or _exporter(config)
    if not batch:
        return Tracer(config, lambda span: chosen.export([span]), chosen.shutdown)
    batcher = BatchExporter(chosen)
    return Tracer(config, batcher.add, batcher.shutdown)


def client_tracer(config: TraceConfig) -> Tracer:
    """A tracer for a client (``fnrt invoke``, the edge client): it exports as ``config``
    says, and otherwise still makes real trace ids, so the server's spans share the
    client's trace id."""
    from fnrt.tracing.recorder import Tracer

    return build_tracer(config) or Tracer(config, lambda span: None)


def _exporter(config: TraceConfig) -> SpanExporter:
    from fnrt.tracing.export import ConsoleExporter, OtlpHttpExporter

    if config.exporter == "console":
        return ConsoleExporter()
    if config.protocol != "http/protobuf":
        raise ValueError(
            f"protocol: fnrt exports OTLP over http/protobuf, not {config.protocol} "
            "(every OpenTelemetry collector takes it on port 4318)"
        )
    return OtlpHttpExporter(
        config.endpoint or DEFAULT_OTLP_ENDPOINT, {"service.name": config.service_name}
    )
