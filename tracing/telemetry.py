"""Everything the runtime reports, in one object passed where it is needed."""

from __future__ import annotations

from dataclasses import dataclass, field

from fnrt.tracing.metrics import Metrics
from fnrt.tracing.spans import Tracing


@dataclass
class Telemetry:
    """Spans (``tracing``, possibly off), metrics, and whether each request is logged."""

    tracing: Tracing = field(default_factory=Tracing)
    metrics: Metrics = field(default_factory=lambda: Metrics(gpu=False))
    request_log: bool = False
