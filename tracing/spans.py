"""The spans of one request, and W3C trace context in and out.

One invoke makes a server span (HTTP semantic-convention attributes; the
caller's ``traceparent`` / ``tracestate`` as its parent; ``traceresponse``
in the reply) with children for its queue wait, the model load it waited for
(tier, bytes, per-step timings) and the encoding of its answer. The server
span keeps its attributes as two tuples of fields until it is exported
(:class:`fnrt.tracing.recorder.ServerSpan`). Its children are known whole when
they are made, so they are plain tuples kept by the server span (its queue
wait and encoding as times, ``queued`` and ``encoded``; a load as a child it
carries, :meth:`fnrt.tracing.recorder.BaseSpan.after`) until the shipper
encodes them as spans of their own. Each batch is one span of its own, linked
to every request span it served. With tracing off every method is a ``None``
check, so the request path pays nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

from fnrt.tracing.recorder import (
    SPAN_ID_CHARS,
    TRACE_ID_CHARS,
    BaseSpan,
    ServerSpan,
    Span,
    SpanContext,
    SpanKind,
    StatusCode,
    Tracer,
    format_traceparent,
)


class Tracing:
    """Makes fnrt's spans with a given tracer (None: tracing off)."""

    def __init__(self, tracer: Tracer | None = None) -> None:
        self.tracer = tracer

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    def server_span(
        self, method: str, route: str, path: str, headers: Mapping[str, str]
    ) -> ServerSpan | None:
        """The span of one HTTP request, continuing the caller's trace when it sent one
        (:meth:`Tracer.start_request`)."""
        if self.tracer is None:
            return None
        return self.tracer.start_request(method, route, path, headers)

    def start(self, name: str, *, kind: SpanKind = SpanKind.INTERNAL) -> Span | None:
        """A span that begins a trace (a client's call)."""
        if self.tracer is None:
            return None
        return self.tracer.start(name, kind=kind)

    def after(
        self,
        parent: BaseSpan | ServerSpan | None,
        name: str,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, Any],
    ) -> None:
        """A child of ``parent``, when it is recorded, that began and ended already
        (a queue wait, a load, an encoding): carried by ``parent`` and exported with
        it (:meth:`Span.after`)."""
        if parent is not None and parent.recording:
            parent.after(name, start_ns, end_ns, attributes)

    def batch_span(
        self, function: str, version: str, links: list[SpanContext], start_ns: int
    ) -> Span | None:
        """One batch's span, linked to the span of every recorded request it served
        (``links``: their contexts; None when there is none)."""
        if self.tracer is None or not links:
            return None
        return self.tracer.start(
            f"batch {function}",
            links=links,
            start_ns=start_ns,
            attributes={
                "fnrt.function": function,
                "fnrt.version": version,
                "fnrt.batch.size": len(links),
            },
        )

    def record(self, handler_spans: Iterable[Mapping[str, Any]]) -> None:
        """Export spans a handler made through the OpenTelemetry API
        (:mod:`fnrt.tracing.handler_spans`), as its batch's children."""
        if self.tracer is None:
            return
        for s in handler_spans:
            trace_id = int(s["trace_id"], 16)
            code, message = s["status"]
            self.tracer.record(
                str(s["name"]),
                SpanContext(trace_id, int(s["span_id"], 16), True),
                SpanContext(trace_id, int(s["parent_span_id"], 16), True),
                kind=SpanKind(int(s["kind"])),
                start_ns=int(s["start_ns"]),
                end_ns=int(s["end_ns"]),
                attributes=dict(s["attributes"]),
                events=[(str(n), int(t), dict(a)) for n, t, a in s["events"]],
                status=(StatusCode(int(code)), str(message)),
            )

    def shutdown(self) -> None:
        if self.tracer is not None:
            self.tracer.shutdown()


def inject(span: BaseSpan | ServerSpan | None, headers: MutableMapping[str, str]) -> None:
    """Write ``span``'s context as ``traceparent`` (and ``tracestate``) into ``headers``."""
    if span is None:
        return
    headers["traceparent"] = format_traceparent(span.context)
    if span.context.trace_state:
        headers["tracestate"] = span.context.trace_state


def fail(
    span: BaseSpan | ServerSpan | None, error: BaseException, *, server_fault: bool = True
) -> None:
    """Record ``error`` on ``span``; status ERROR when it was the server's fault (5xx)."""
    if span is None:
        return
    span.set_attribute("error.type", type(error).__name__)
    if server_fault:
        span.record_exception(error)
        span.set_status(StatusCode.ERROR, str(error))


def traceresponse(span: Span | ServerSpan | None) -> tuple[bytes, bytes] | None:
    """The W3C ``traceresponse`` header naming ``span``, as ASGI sends it (None without
    a span)."""
    return None if span is None else (b"traceresponse", span.traceparent.encode())


def ids(span: Span | ServerSpan | None) -> tuple[str, str] | None:
    """``(trace_id, span_id)`` in hex, for logs."""
    if span is None:
        return None
    traceparent = span.traceparent  # 00-{trace id}-{span id}-{flags}
    return traceparent[TRACE_ID_CHARS], traceparent[SPAN_ID_CHARS]
