"""Tracing configuration: :class:`TraceConfig` and the standard ``OTEL_*`` variables.

A leaf of ``fnrt.tracing``: the recorder, the exporters and the set-up all
read it, and it imports none of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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
