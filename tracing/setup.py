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

from typing import TYPE_CHECKING

from fnrt.tracing.config import (
    DEFAULT_OTLP_ENDPOINT,
    EXPORTERS,
    PROTOCOLS,
    SAMPLERS,
    TraceConfig,
    trace_config_from_env,
)
from fnrt.tracing.recorder import Tracer

if TYPE_CHECKING:
    from fnrt.tracing.export import SpanExporter

__all__ = [
    "DEFAULT_OTLP_ENDPOINT",
    "EXPORTERS",
    "PROTOCOLS",
    "SAMPLERS",
    "TraceConfig",
    "build_tracer",
    "client_tracer",
    "trace_config_from_env",
]


def build_tracer(
    config: TraceConfig,
    exporter: SpanExporter | None = None,
    *,
    batch: bool = True,
    shipped: bool = False,
) -> Tracer | None:
    """A tracer exporting to ``exporter`` (or the one ``config`` names); None when off.

    Spans leave through a background batch (off the request path) unless
    ``batch`` is False (tests read them as soon as they end). ``shipped`` (a
    server) encodes and posts OTLP from a process of its own
    (:mod:`fnrt.tracing.shipper`), so the encoding never takes the GIL the
    event loop needs; a short-lived client encodes in its own thread.
    """
    if exporter is None and not config.enabled:
        return None
    from fnrt.tracing.export import BatchExporter
    from fnrt.tracing.shipper import FRAME_SPANS

    chosen = exporter or _exporter(config, shipped)
    if not batch:
        return Tracer(config, lambda span: chosen.export([span]), chosen.shutdown)
    # shipped: a frame at a time, so a span is gone in tens of milliseconds (objects
    # kept for a second reach the collector's oldest generation, which scans them all)
    batcher = BatchExporter(chosen, batch_size=FRAME_SPANS) if shipped else BatchExporter(chosen)
    return Tracer(config, batcher.add, batcher.shutdown, batcher.add_many)


def client_tracer(config: TraceConfig) -> Tracer:
    """A tracer for a client (``fnrt invoke``, the edge client): it exports as ``config``
    says, and otherwise still makes real trace ids, so the server's spans share the
    client's trace id."""
    return build_tracer(config) or Tracer(config, lambda span: None)


def _exporter(config: TraceConfig, shipped: bool) -> SpanExporter:
    from fnrt.tracing.export import ConsoleExporter, OtlpHttpExporter
    from fnrt.tracing.shipper import ShippedExporter

    if config.exporter == "console":
        return ConsoleExporter()
    if config.protocol != "http/protobuf":
        raise ValueError(
            f"protocol: fnrt exports OTLP over http/protobuf, not {config.protocol} "
            "(every OpenTelemetry collector takes it on port 4318)"
        )
    endpoint = config.endpoint or DEFAULT_OTLP_ENDPOINT
    resource = {"service.name": config.service_name}
    if shipped:
        return ShippedExporter(endpoint, resource)
    return OtlpHttpExporter(endpoint, resource)
