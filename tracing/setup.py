"""OpenTelemetry set-up from the standard ``OTEL_*`` variables (and ``--trace`` flags).

Nothing here runs on import, and nothing is set globally: :func:`tracer_provider`
returns a provider that the server (or a test, with its own in-memory
exporter) passes where spans are made.

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
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.sampling import Sampler

EXPORTERS = ("none", "console", "otlp")
PROTOCOLS = ("http/protobuf", "grpc")
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


def sampler(config: TraceConfig) -> Sampler:
    from opentelemetry.sdk.trace import sampling

    name, ratio = config.sampler, config.sampler_ratio
    if name == "always_on":
        return sampling.ALWAYS_ON
    if name == "always_off":
        return sampling.ALWAYS_OFF
    if name == "traceidratio":
        return sampling.TraceIdRatioBased(ratio)
    if name == "parentbased_always_off":
        return sampling.ParentBased(sampling.ALWAYS_OFF)
    if name == "parentbased_traceidratio":
        return sampling.ParentBased(sampling.TraceIdRatioBased(ratio))
    return sampling.ParentBased(sampling.ALWAYS_ON)


def _exporter(config: TraceConfig) -> SpanExporter:
    if config.exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(service_name=config.service_name)
    if config.protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError:
            raise ValueError(
                "protocol grpc needs opentelemetry-exporter-otlp-proto-grpc installed; "
                "or use http/protobuf"
            ) from None
        grpc: SpanExporter = (
            GrpcExporter(endpoint=config.endpoint) if config.endpoint else GrpcExporter()
        )
        return grpc
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    if config.endpoint is None:
        return OTLPSpanExporter()
    endpoint = config.endpoint.rstrip("/")
    if not endpoint.endswith("/v1/traces"):  # the variable names the collector, not the path
        endpoint += "/v1/traces"
    return OTLPSpanExporter(endpoint=endpoint)


def tracer_provider(
    config: TraceConfig, exporter: SpanExporter | None = None, *, batch: bool = True
) -> TracerProvider | None:
    """A provider exporting to ``exporter`` (or the one ``config`` names); None when off.

    Spans leave through a batching processor (off the request path) unless
    ``batch`` is False (tests read them at once).
    """
    if exporter is None and not config.enabled:
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(
        resource=Resource.create({"service.name": config.service_name}),
        sampler=sampler(config),
    )
    chosen = exporter or _exporter(config)
    provider.add_span_processor(
        BatchSpanProcessor(chosen) if batch else SimpleSpanProcessor(chosen)
    )
    return provider


def client_provider(config: TraceConfig) -> TracerProvider:
    """A provider for a client (``fnrt invoke``, the edge client): it exports as
    ``config`` says, and otherwise still makes real trace ids, so the server's
    spans share the client's trace id."""
    provider = tracer_provider(config)
    if provider is not None:
        return provider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    return TracerProvider(
        resource=Resource.create({"service.name": config.service_name}), sampler=sampler(config)
    )
