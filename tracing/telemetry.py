"""Everything the runtime reports, in one object passed where it is needed."""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from time import time_ns

from fnrt.tracing.access import AccessLog
from fnrt.tracing.metrics import Metrics
from fnrt.tracing.recorder import END_NS, ServerSpan, answered
from fnrt.tracing.spans import Tracing


@dataclass
class Telemetry:
    """Spans (``tracing``, possibly off), metrics, and the request log (None: off)."""

    tracing: Tracing = field(default_factory=Tracing)
    metrics: Metrics = field(default_factory=lambda: Metrics(gpu=False))
    access: AccessLog | None = None
    #: requests ended since the last :meth:`flush` (a turn of the event loop ago at most)
    ended: list[Ended] = field(default_factory=list)
    #: those of them whose spans are recorded, exported at once (:func:`answered`)
    spans: list[Ended] = field(default_factory=list)

    def request(
        self,
        route: str,
        function: str,
        version: str,
        status: int,
        seconds: float,
        cold_start: str | None,
        span: ServerSpan | None = None,
    ) -> None:
        """One request ended: its metrics and its request-log line are made with the
        others that ended in the same turn of the event loop (the answers of a batch),
        at the end of it (:meth:`flush`), and so is its span (``span``, its server span
        when tracing is on), when recorded: ended here (its end time set), made the
        request it exports as at the turn's end (:func:`answered`), with the log's ids
        cut from its ``traceparent`` there. An append a request."""
        ended = self.ended
        if not ended:
            asyncio.get_running_loop().call_soon(self.flush)
        ms = round(seconds * 1000, 3)  # as the request log shows it
        request = (route, function, version, status, ms, cold_start, span, seconds)
        ended.append(request)
        if span is not None and span.recording and not span[END_NS]:  # not ended already
            span[END_NS] = time_ns()
            self.spans.append(request)

    def flush(self) -> None:
        """The metrics and log lines of the requests ended since the last flush: counted
        per label set and per histogram bucket with ``Counter`` and ``map`` (no Python
        frame an item), the log lines queued at once, and the recorded spans handed to
        the tracer's export at once."""
        ended, self.ended = self.ended, []
        if self.spans:
            traced, self.spans = self.spans, []
            tracer = self.tracing.tracer
            if tracer is not None:
                tracer.export(answered(list(map(_SPAN, traced)), list(map(_RESPONSE, traced))))
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
#: the request log writes them), the tier of its cold start, its server span (None:
#: tracing off), seconds.
Ended = tuple[str, str, str, int, float, "str | None", "ServerSpan | None", float]
_LABELS = itemgetter(1, 2, 3)
_SPAN = itemgetter(6)
#: What answered a request, as its span keeps it (``recorder.Response``): status
#: code, function, version, the cold start's tier.
_RESPONSE = itemgetter(3, 1, 2, 5)
_FUNCTION = itemgetter(1)
_SECONDS = itemgetter(7)
