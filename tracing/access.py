"""The request log: one JSON line per request, written off the request path.

Going through :mod:`logging` cost ~21 µs a line (a record, a lock, a
formatter, a write and a flush each), a third of the throughput of a small
model. Here a line is an ``orjson`` dump appended to a queue; a thread
writes what piled up every ``interval_s``. Lines have the shape of the JSON
logs (``ts``, ``level``, ``logger``, ``message``) plus the request's fields.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from itertools import repeat
from operator import attrgetter, getitem, itemgetter
from typing import Any, BinaryIO

import orjson

from fnrt.tracing.recorder import SPAN_ID_CHARS, TRACE_ID_CHARS


class AccessLog:
    """Buffered JSON lines to ``stream`` (stderr by default)."""

    def __init__(
        self, stream: BinaryIO | None = None, interval_s: float = 0.2, *, owns_stream: bool = False
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr.buffer
        self._owns_stream = owns_stream  # a file opened for it: closed with it
        self.interval_s = interval_s
        self._lines: deque[bytes] = deque()
        self._second = -1
        self._stamp = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fnrt-access-log", daemon=True)
        self._thread.start()

    def request(
        self,
        route: str,
        function: str,
        version: str,
        status: int,
        seconds: float,
        cold_start: str | None = None,
        trace: tuple[str, str] | None = None,
    ) -> None:
        """Queue one request's line (the request path: one dict, a dump and an append):
        its route, who answered, the status, the time in ms, the tier of a cold start,
        and its trace's and span's ids (:func:`fnrt.tracing.spans.ids`)."""
        line: dict[str, Any] = {
            "ts": self._timestamp(),
            "level": "info",
            "logger": "fnrt.access",
            "message": "request",
            "route": route,
            "function": function,
            "version": version,
            "status": status,
            "duration_ms": round(seconds * 1000, 3),
        }
        if cold_start is not None:
            line["cold_start"] = cold_start
        if trace is not None:
            line["trace_id"], line["span_id"] = trace
        self._lines.append(orjson.dumps(line))

    def _timestamp(self) -> str:
        """Now, to the millisecond, UTC (strftime once a second, not once a line)."""
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._stamp}.{int((now - second) * 1000):03d}Z"

    def requests(self, ended: Sequence[tuple[Any, ...]]) -> None:
        """Queue the lines of requests that ended together (a tuple each: route,
        function, version, status, milliseconds, cold start, server span or None, as
        ``Telemetry.request`` keeps them): one stamp and one append for them all, and the
        usual lines (no cold start; traced or not) made with ``map`` (no Python frame a
        line), a traced one's ids cut from its span's ``traceparent``; a lone request's
        line (one connection) as it is, without setting up the maps."""
        stamp = self._timestamp()
        if len(ended) == 1:  # a lone request (one connection): its line as it is
            route, function, version, status, ms, cold_start, span, *_ = ended[0]
            line = {
                "ts": stamp,
                "level": "info",
                "logger": "fnrt.access",
                "message": "request",
                "route": route,
                "function": function,
                "version": version,
                "status": status,
                "duration_ms": ms,
            }
            if cold_start is not None:
                line["cold_start"] = cold_start
            if span is not None:
                traceparent = span.traceparent
                line["trace_id"] = traceparent[TRACE_ID_CHARS]
                line["span_id"] = traceparent[SPAN_ID_CHARS]
            self._lines.append(orjson.dumps(line))
            return
        head = (stamp, "info", "fnrt.access", "request")
        plain = [e for e in ended if e[5] is None and e[6] is None]
        if len(plain) == len(ended):
            rows = map(tuple.__add__, repeat(head), map(_FIELDS, plain))
            self._lines.extend(map(orjson.dumps, map(dict, map(zip, repeat(_KEYS), rows))))
            return
        if not plain and all(e[5] is None for e in ended):
            # traced and warm (every request, tracing at 100%): the same, with the ids
            parents = list(map(_TRACEPARENT, map(_SPAN, ended)))
            ids = zip(
                map(getitem, parents, repeat(TRACE_ID_CHARS)),
                map(getitem, parents, repeat(SPAN_ID_CHARS)),
                strict=True,
            )
            rows = map(tuple.__add__, repeat(head), map(_FIELDS, ended))
            rows = map(tuple.__add__, rows, ids)
            self._lines.extend(map(orjson.dumps, map(dict, map(zip, repeat(_TRACED_KEYS), rows))))
            return
        # mixed (a cold start among them, some traced): a line at a time, in order
        for route, function, version, status, ms, cold_start, span, *_ in ended:
            line = dict(zip(_KEYS, (*head, route, function, version, status, ms), strict=True))
            if cold_start is not None:
                line["cold_start"] = cold_start
            if span is not None:
                line["trace_id"] = span.traceparent[TRACE_ID_CHARS]
                line["span_id"] = span.traceparent[SPAN_ID_CHARS]
            self._lines.append(orjson.dumps(line))

    def flush(self) -> None:
        lines = self._lines
        if not lines:
            return
        chunk = [lines.popleft() for _ in range(len(lines))]
        try:
            self.stream.write(b"\n".join(chunk) + b"\n")
            self.stream.flush()
        except (OSError, ValueError):  # stderr closed at exit: nothing left to tell
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.flush()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.flush()
        if self._owns_stream:
            self.stream.close()


#: A request line's keys, in order, and where :meth:`AccessLog.requests` finds their
#: values in an ended request after the four the batch shares.
_KEYS = (
    "ts",
    "level",
    "logger",
    "message",
    "route",
    "function",
    "version",
    "status",
    "duration_ms",
)
_FIELDS = itemgetter(0, 1, 2, 3, 4)
#: A traced line's keys (the trace's and span's ids last, cut from the ``traceparent``
#: of the span an ended request carries).
_TRACED_KEYS = (*_KEYS, "trace_id", "span_id")
_SPAN = itemgetter(6)
_TRACEPARENT = attrgetter("traceparent")
