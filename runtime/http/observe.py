"""What the data path reports about each request: metrics, its server span, a log line.

Invokes and infers are served as raw ASGI (see :mod:`fnrt.runtime.http.data`),
so they report here rather than through middleware: :func:`server_span` opens the
request's span, :func:`end` closes it and hands the request to the telemetry,
which makes its metrics and its JSON line in the request log together with
those of every request that ended in the same turn of the event loop (the
answers of one batch): ``Telemetry.request`` is an append a request.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, MutableMapping
from typing import Any, Protocol

from fnrt.tracing.telemetry import Telemetry


class Trail(Protocol):
    """What one request reached, filled in as it is served (a data route's ``Incoming``)."""

    route: str
    started_s: float  # time.perf_counter() when it began
    function: str
    version: str
    cold_tier: str | None
    span: Any  # its server span, when tracing is on


def server_span(
    telemetry: Telemetry | None,
    route: str,
    scope: MutableMapping[str, Any],
    headers: Mapping[str, str],
) -> Any:
    """The request's server span (None without telemetry or tracing): the tracer's
    ``start_request``, called from here (one frame less than through ``Tracing``)."""
    if telemetry is None:
        return None
    tracer = telemetry.tracing.tracer
    if tracer is None:
        return None
    return tracer.start_request(scope["method"], route, scope["path"], headers)


def end(telemetry: Telemetry | None, trail: Trail, status: int) -> None:
    """The request ended: its metrics, log line and span, made with those of the others
    that end in this turn of the event loop, at its end (``Telemetry.request``)."""
    if telemetry is None:
        return
    telemetry.request(
        trail.route,
        trail.function,
        trail.version,
        status,
        time.perf_counter() - trail.started_s,
        trail.cold_tier,
        trail.span,
    )
