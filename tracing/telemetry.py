"""Everything the runtime reports, in one object passed where it is needed."""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter

from fnrt.tracing.access import AccessLog
from fnrt.tracing.metrics import Metrics
from fnrt.tracing.recorder import Flat
from fnrt.tracing.spans import Tracing


@dataclass
class Telemetry:
    """Spans (``tracing``, possibly off), metrics, and the request log (None: off)."""

    tracing: Tracing = field(default_factory=Tracing)
    metrics: Metrics = field(default_factory=lambda: Metrics(gpu=False))
    access: AccessLog | None = None
    #: requests ended since the last :meth:`flush` (a turn of the event loop ago at most)
    ended: list[Ended] = field(default_factory=list)
    #: the spans of those requests, when recorded (``ServerSpan.ended``), exported at once
    spans: list[Flat] = field(default_factory=list)

    def request(
        self,
        route: str,
        function: str,
        version: str,
        status: int,
        seconds: float,
        cold_start: str | None,
        trace: tuple[str, str] | None,
        span: Flat | None = None,
    ) -> None:
        """One request ended: its metrics and its request-log line are made with the
        others that ended in the same turn of the event loop (the answers of a batch),
        at the end of it (:meth:`flush`), and so is its ended span (``span``), when
        recorded. An append a request."""
        ended = self.ended
        if not ended:
            asyncio.get_running_loop().call_soon(self.flush)
        ms = round(seconds * 1000, 3)  # as the request log shows it
        ended.append((route, function, version, status, ms, cold_start, trace, seconds))
        if span is not None:
            self.spans.append(span)

    def flush(self) -> None:
        """The metrics and log lines of the requests ended since the last flush: counted
        per label set and per histogram bucket with ``Counter`` and ``map`` (no Python
        frame an item), the log lines queued at once."""
        ended, self.ended = self.ended, []
        if self.spans:
            spans, self.spans = self.spans, []
            tracer = self.tracing.tracer
            if tracer is not None:
                tracer.export(spans)
        if not ended:
            return
        if len(ended) == 1:  # a lone request (one connection): no Counter, set or map
            self._one(ended[0])
        else:
            self._many(ended)
        if self.access is not None:
            self.access.requests(ended)

    def _one(self, request: Ended) -> None:
        _, function, version, status, _, _, _, seconds = request
        values = self.metrics.requests.values
        labels = (function, version, str(status))
        values[labels] = values.get(labels, 0.0) + 1
        histogram = self.metrics.request_seconds
        histogram.observe(histogram.child((function,)), seconds)

    def _many(self, ended: list[Ended]) -> None:
        values = self.metrics.requests.values
        for (function, version, status), n in Counter(map(_LABELS, ended)).items():
            labels = (function, version, str(status))
            values[labels] = values.get(labels, 0.0) + n
        histogram = self.metrics.request_seconds
        functions = set(map(_FUNCTION, ended))
        for function in functions:
            mine = ended if len(functions) == 1 else [e for e in ended if e[1] == function]
            seconds = list(map(_SECONDS, mine))
            child = histogram.child((function,))
            for bucket, n in Counter(map(bisect_left, repeat(histogram.bounds), seconds)).items():
                child[bucket] += n
            child[-1] += sum(seconds)

    def close(self) -> None:
        """Export the spans and write the log lines still buffered."""
        self.flush()
        self.tracing.shutdown()
        if self.access is not None:
            self.access.close()


#: A request as it ended: route, function, version, status, milliseconds (rounded as
#: the request log writes them), the tier of its cold start, its trace's and span's ids,
#: seconds.
Ended = tuple[str, str, str, int, float, "str | None", "tuple[str, str] | None", float]
_LABELS = itemgetter(1, 2, 3)
_FUNCTION = itemgetter(1)
_SECONDS = itemgetter(7)
