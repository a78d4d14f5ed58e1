"""Everything the runtime reports, in one object passed where it is needed."""

from __future__ import annotations

from dataclasses import dataclass, field

from fnrt.tracing.access import AccessLog
from fnrt.tracing.metrics import Metrics
from fnrt.tracing.spans import Tracing


@dataclass
class Telemetry:
    """Spans (``tracing``, possibly off), metrics, and the request log (None: off)."""

    tracing: Tracing = field(default_factory=Tracing)
    metrics: Metrics = field(default_factory=lambda: Metrics(gpu=False))
    access: AccessLog | None = None

    def close(self) -> None:
        """Export the spans and write the log lines still buffered."""
        self.tracing.shutdown()
        if self.access is not None:
            self.access.close()
