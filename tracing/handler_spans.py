"""Spans a handler makes through the OpenTelemetry API join the batch's trace.

A handler (or a library it calls, instrumented with OpenTelemetry) writes::

    from opentelemetry import trace
    tracer = trace.get_tracer(__name__)

    def handle(batch):
        with tracer.start_as_current_span("tokenize"):
            ...

While fnrt runs a batch, :func:`capture` makes the batch's span the current
one in the OpenTelemetry context, and this process's tracer provider (set
once, here) records the spans started under it as plain dicts; the server
turns them into its own spans and exports them with the rest of the trace
(a worker process sends them back with the batch's answer). Nothing happens
when ``opentelemetry-api`` is not installed, when the batch is not traced, or
when a handler has set a tracer provider of its own first.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("fnrt.tracing")

#: A batch span's identity as sent to an instance: trace id and span id in hex.
TraceParent = tuple[str, str]

_lock = threading.Lock()
_installed: bool | None = None  # None: not tried; False: no opentelemetry, or not ours
_open: dict[int, list[dict[str, Any]]] = {}  # trace id -> finished spans of running batches


@contextlib.contextmanager
def capture(parent: TraceParent | None) -> Iterator[list[dict[str, Any]]]:
    """Run the block with ``parent`` as the current OpenTelemetry span; the list it
    yields holds, after the block, the spans the handler finished under it."""
    spans: list[dict[str, Any]] = []
    if parent is None or not _install():
        yield spans
        return
    from opentelemetry import context, trace

    trace_id, span_id = int(parent[0], 16), int(parent[1], 16)
    remote = trace.SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED)
    )
    with _lock:
        _open[trace_id] = spans
    token = context.attach(trace.set_span_in_context(trace.NonRecordingSpan(remote)))
    try:
        yield spans
    finally:
        context.detach(token)
        with _lock:
            _open.pop(trace_id, None)


def _install() -> bool:
    """Set fnrt's tracer provider, once per process (instances' threads race here)."""
    global _installed
    if _installed is not None:
        return _installed
    with _lock:
        if _installed is None:
            try:
                from opentelemetry import trace
            except ImportError:
                _installed = False
                return False
            provider = _provider_class(trace)()
            trace.set_tracer_provider(provider)  # refused (and logged) if one is set already
            _installed = trace.get_tracer_provider() is provider
            if not _installed:
                log.info("a tracer provider was set before fnrt's: handler spans go there")
        return _installed


def _finished(record: dict[str, Any], trace_id: int) -> None:
    with _lock:
        spans = _open.get(trace_id)
    if spans is not None:  # a span that outlives its batch is dropped
        spans.append(record)


def _provider_class(trace: Any) -> type[Any]:
    """The OpenTelemetry API classes, made on first use (the API is optional)."""

    class Span(trace.NonRecordingSpan):  # type: ignore[misc]
        """A recording span: on ``end`` it becomes a dict of its batch's spans."""

        def __init__(
            self,
            name: str,
            context: Any,
            parent: Any,
            kind: Any,
            attributes: Any,
            start_ns: int | None,
        ) -> None:
            super().__init__(context)
            self._name = name
            self._parent = parent
            self._kind = int(kind.value) + 1  # OTLP numbers kinds from 1 (internal)
            self._attributes = dict(attributes or {})
            self._events: list[list[Any]] = []
            self._status = (0, "")
            self._start_ns = start_ns or time.time_ns()
            self._ended = False

        def is_recording(self) -> bool:
            return not self._ended

        def set_attribute(self, key: str, value: Any) -> None:
            self._attributes[key] = value

        def set_attributes(self, attributes: Any) -> None:
            self._attributes.update(attributes)

        def add_event(self, name: str, attributes: Any = None, timestamp: Any = None) -> None:
            self._events.append([name, timestamp or time.time_ns(), dict(attributes or {})])

        def update_name(self, name: str) -> None:
            self._name = name

        def set_status(self, status: Any, description: str | None = None) -> None:
            code = getattr(status, "status_code", status)
            message = description or getattr(status, "description", None) or ""
            self._status = (int(code.value), message)

        def record_exception(
            self,
            exception: BaseException,
            attributes: Any = None,
            timestamp: Any = None,
            escaped: bool = False,
        ) -> None:
            self.add_event(
                "exception",
                {"exception.type": type(exception).__name__, "exception.message": str(exception)},
                timestamp,
            )

        def end(self, end_time: int | None = None) -> None:
            if self._ended:
                return
            self._ended = True
            context = self.get_span_context()
            _finished(
                {
                    "name": self._name,
                    "trace_id": f"{context.trace_id:032x}",
                    "span_id": f"{context.span_id:016x}",
                    "parent_span_id": f"{self._parent.span_id:016x}",
                    "kind": self._kind,
                    "start_ns": self._start_ns,
                    "end_ns": end_time or time.time_ns(),
                    "attributes": self._attributes,
                    "events": self._events,
                    "status": list(self._status),
                },
                context.trace_id,
            )

    class Tracer(trace.Tracer):  # type: ignore[misc]
        def start_span(
            self,
            name: str,
            context: Any = None,
            kind: Any = trace.SpanKind.INTERNAL,
            attributes: Any = None,
            links: Any = None,
            start_time: int | None = None,
            record_exception: bool = True,
            set_status_on_exception: bool = True,
        ) -> Any:
            parent = trace.get_current_span(context).get_span_context()
            if not parent.is_valid or not parent.trace_flags.sampled:
                return trace.INVALID_SPAN  # not under a traced batch: nothing to record
            own = trace.SpanContext(
                parent.trace_id,
                random.getrandbits(64) or 1,
                is_remote=False,
                trace_flags=parent.trace_flags,
            )
            return Span(name, own, parent, kind, attributes, start_time)

        @contextlib.contextmanager
        def start_as_current_span(
            self,
            name: str,
            context: Any = None,
            kind: Any = trace.SpanKind.INTERNAL,
            attributes: Any = None,
            links: Any = None,
            start_time: int | None = None,
            record_exception: bool = True,
            set_status_on_exception: bool = True,
            end_on_exit: bool = True,
        ) -> Iterator[Any]:
            span = self.start_span(name, context, kind, attributes, links, start_time)
            with trace.use_span(
                span,
                end_on_exit=end_on_exit,
                record_exception=record_exception,
                set_status_on_exception=set_status_on_exception,
            ) as current:
                yield current

    class TracerProvider(trace.TracerProvider):  # type: ignore[misc]
        def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
            return Tracer()

    return TracerProvider
