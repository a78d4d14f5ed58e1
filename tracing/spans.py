"""The spans of one request, and W3C trace context in and out.

One invoke makes a server span (HTTP semantic-convention attributes; the
caller's ``traceparent`` / ``tracestate`` as its parent; ``traceresponse``
in the reply) with children for its queue wait, the model load it waited for
(tier, bytes, per-step timings) and the encoding of its answer. Each batch is
one span of its own, linked to every request span it served. With tracing
off every method is a ``None`` check, so the request path pays nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

TRACERESPONSE = "traceresponse"


class Tracing:
    """Makes fnrt's spans on a given provider (None: tracing off)."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self.provider = provider
        self.tracer: Tracer | None = None
        if provider is not None:
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )

            self.tracer = provider.get_tracer("fnrt")
            self._propagator = TraceContextTextMapPropagator()

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    def server_span(
        self, method: str, route: str, path: str, headers: Mapping[str, str]
    ) -> Span | None:
        """The span of one HTTP request, continuing the caller's trace when it sent one."""
        if self.tracer is None:
            return None
        from opentelemetry.trace import SpanKind

        parent = self._propagator.extract(headers) if "traceparent" in headers else None
        attributes: dict[str, Any] = {
            "http.request.method": method,
            "http.route": route,
            "url.path": path,
            "url.scheme": "http",
        }
        agent = headers.get("user-agent")
        if agent:
            attributes["user_agent.original"] = agent
        return self.tracer.start_span(
            f"{method} {route}", context=parent, kind=SpanKind.SERVER, attributes=attributes
        )

    def child(
        self,
        parent: Span | None,
        name: str,
        attributes: Mapping[str, Any] | None = None,
        *,
        start_ns: int | None = None,
        end_ns: int | None = None,
    ) -> Span | None:
        """A child of ``parent``; ended at ``end_ns`` when given (spans made after the fact)."""
        if self.tracer is None or parent is None:
            return None
        from opentelemetry.trace import set_span_in_context

        span = self.tracer.start_span(
            name,
            context=set_span_in_context(parent),
            attributes=dict(attributes or {}),
            start_time=start_ns,
        )
        if end_ns is not None:
            span.end(end_time=end_ns)
        return span

    def batch_span(
        self, function: str, version: str, requests: Iterable[Span | None], start_ns: int
    ) -> Span | None:
        """One batch's span, linked to the span of every request it served."""
        if self.tracer is None:
            return None
        from opentelemetry.trace import Link

        links = [Link(s.get_span_context()) for s in requests if s is not None]
        return self.tracer.start_span(
            f"batch {function}",
            links=links,
            start_time=start_ns,
            attributes={
                "fnrt.function": function,
                "fnrt.version": version,
                "fnrt.batch.size": len(links),
            },
        )

    def inject(self, span: Span | None, headers: MutableMapping[str, str]) -> None:
        """Write ``span``'s context as ``traceparent`` (and ``tracestate``) into ``headers``."""
        if self.tracer is None or span is None:
            return
        from opentelemetry.trace import set_span_in_context

        self._propagator.inject(headers, context=set_span_in_context(span))


def fail(span: Span | None, error: BaseException, *, server_fault: bool = True) -> None:
    """Record ``error`` on ``span``; status ERROR when it was the server's fault (5xx)."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("error.type", type(error).__name__)
    if server_fault:
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, str(error)))


def finish_server_span(span: Span | None, status: int, attributes: Mapping[str, Any]) -> None:
    """Set the response status (5xx marks the span an error) and end it."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("http.response.status_code", status)
    for key, value in attributes.items():
        span.set_attribute(key, value)
    if status >= 500:  # an error recorded earlier keeps its description
        span.set_status(Status(StatusCode.ERROR))
    span.end()


def traceresponse(span: Span | None) -> str | None:
    """The W3C ``traceresponse`` header value naming ``span``."""
    if span is None:
        return None
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def ids(span: Span | None) -> tuple[str, str] | None:
    """``(trace_id, span_id)`` in hex, for logs."""
    if span is None:
        return None
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"
