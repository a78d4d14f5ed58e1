"""Where ended spans go: batched off the request path to OTLP, the console, or memory.

:class:`BatchExporter` takes spans with a deque append (safe from any thread
under the GIL) and ships them from its own thread, every 50 ms while they
keep coming and every ``interval_s`` otherwise; past ``max_queued`` it drops
and counts, so a collector that is down never grows the server's memory.
"""

from __future__ import annotations

import http.client
import logging
import sys
import threading
import urllib.parse
from collections import deque
from collections.abc import Mapping, Sequence
from itertools import islice
from typing import Any, Protocol, TextIO

import orjson

from fnrt.tracing.otlp import YIELD_EVERY, encode_request
from fnrt.tracing.recorder import Flat, Span, as_span, expand

log = logging.getLogger("fnrt.tracing")


#: What the request path hands an exporter: ended spans and spans made after the fact,
#: flat (:data:`fnrt.tracing.recorder.Flat`; :func:`as_span` makes them spans again).
Exported = Flat


class SpanExporter(Protocol):
    def export(self, spans: Sequence[Exported]) -> None: ...

    def shutdown(self) -> None: ...


def traces_url(endpoint: str) -> str:
    """The collector's ``/v1/traces`` URL; ValueError when it is not an http(s) URL."""
    endpoint = endpoint.rstrip("/")
    if not endpoint.endswith("/v1/traces"):  # the variable names the collector, not the path
        endpoint += "/v1/traces"
    url = urllib.parse.urlsplit(endpoint)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"endpoint: {endpoint!r} is not an http(s) URL")
    return endpoint


class OtlpHttpExporter:
    """``POST {endpoint}/v1/traces`` with OTLP protobuf bodies, on one kept-alive connection.

    In a server it runs in the shipper process (:mod:`fnrt.tracing.shipper`)."""

    def __init__(
        self,
        endpoint: str,
        resource: Mapping[str, Any],
        timeout_s: float = 10.0,
        yield_every: int = YIELD_EVERY,
    ) -> None:
        self.endpoint = traces_url(endpoint)
        self.yield_every = yield_every  # see encode_request (0 in the shipper)
        self._url = urllib.parse.urlsplit(self.endpoint)
        self.resource = dict(resource)
        self.timeout_s = timeout_s
        self.failures = 0
        self._connection: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        url = self._url
        kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        return kind(url.hostname or "", url.port, timeout=self.timeout_s)

    def export(self, spans: Sequence[Exported]) -> None:
        body = encode_request(spans, self.resource, yield_every=self.yield_every)
        headers = {"Content-Type": "application/x-protobuf"}
        for attempt in (1, 2):  # a kept-alive connection the collector closed: once more
            connection = self._connection or self._connect()
            self._connection = connection
            try:
                connection.request("POST", self._url.path, body, headers)
                response = connection.getresponse()
                response.read()
                if response.status >= 400:
                    raise OSError(f"HTTP {response.status}")
                return
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                self._connection = None
                if attempt == 2:
                    self.failures += 1
                    if self.failures in (1, 10, 100) or self.failures % 1000 == 0:
                        log.warning(
                            "exporting %d spans to %s failed: %s", len(spans), self.endpoint, exc
                        )

    def shutdown(self) -> None:
        if self._connection is not None:
            self._connection.close()


def span_dict(span: Span) -> dict[str, Any]:
    """A span as plain data (the console exporter's lines, and handy in tests)."""
    return {
        "name": span.name,
        "trace_id": f"{span.context.trace_id:032x}",
        "span_id": f"{span.context.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent is not None else None,
        "kind": span.kind.name.lower(),
        "start_ns": span.start_ns,
        "duration_ms": round((span.end_ns - span.start_ns) / 1e6, 3),
        "attributes": span.attributes,
        "links": [f"{link.span_id:016x}" for link in span.links],
        "events": [{"name": n, "attributes": a} for n, _, a in span.events],
        "status": span.status.name.lower(),
    }


class ConsoleExporter:
    """One JSON line per span on stdout."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout

    def export(self, spans: Sequence[Exported]) -> None:
        for item in spans:
            for span in expand(item):
                line = orjson.dumps(span_dict(as_span(span)), default=str).decode()
                self.stream.write(line + "\n")
        self.stream.flush()

    def shutdown(self) -> None:
        pass


class MemoryExporter:
    """Keeps every span (tests read them)."""

    def __init__(self) -> None:
        self.spans: list[Span] = []

    def export(self, spans: Sequence[Exported]) -> None:
        self.spans.extend(as_span(span) for item in spans for span in expand(item))

    def shutdown(self) -> None:
        pass

    def named(self, name: str) -> list[Span]:
        return [s for s in self.spans if s.name == name]

    def clear(self) -> None:
        self.spans.clear()


class BatchExporter:
    """Collects ended spans and hands them to ``exporter`` from a background thread,
    ``batch_size`` to a call: every ``busy_interval_s`` while spans keep coming,
    every ``interval_s`` when none came since the last look (so an idle server
    wakes once a second). The request path only appends: it never wakes the
    thread (a wake-up costs the event loop a system call and a GIL hand-over)."""

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        interval_s: float = 1.0,
        busy_interval_s: float = 0.05,
        batch_size: int = 2048,
        max_queued: int = 65_536,
    ) -> None:
        self.exporter = exporter
        self.interval_s = interval_s
        self.busy_interval_s = min(busy_interval_s, interval_s)
        self.batch_size = batch_size
        self.max_queued = max_queued
        self.dropped = 0
        self._pending: deque[Exported] = deque()  # append and popleft are atomic
        self._wake = threading.Event()  # set to stop
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="fnrt-span-export", daemon=True)
        self._thread.start()

    def add(self, span: Exported) -> None:
        """Take one ended span or record (the request path: an append; past
        ``max_queued`` waiting, it is dropped and counted)."""
        pending = self._pending
        if len(pending) < self.max_queued:
            pending.append(span)
        else:
            self.dropped += 1

    def add_many(self, spans: Sequence[Exported]) -> None:
        """:meth:`add` for each of ``spans`` (a turn's requests), at once."""
        pending = self._pending
        room = self.max_queued - len(pending)
        if len(spans) <= room:
            pending.extend(spans)
        else:
            pending.extend(spans[: max(room, 0)])
            self.dropped += len(spans) - max(room, 0)

    def flush(self) -> None:
        """Export everything taken so far, now (on the calling thread)."""
        pending = self._pending
        while pending:  # each batch taken in C (iter calls popleft; no frame a span)
            batch = list(islice(iter(pending.popleft, None), min(len(pending), self.batch_size)))
            try:
                self.exporter.export(batch)
            except Exception:
                log.exception("span export failed")

    def _run(self) -> None:
        busy = False
        while not self._stop:
            self._wake.wait(self.busy_interval_s if busy else self.interval_s)
            busy = bool(self._pending)
            self.flush()

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(10)
        self.flush()
        self.exporter.shutdown()
