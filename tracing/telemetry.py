"""Everything the runtime reports, in one object passed where it is needed."""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_left
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from time import time_ns
from typing import Any

from fnrt.tracing.access import AccessLog
from fnrt.tracing.metrics import Metrics
from fnrt.tracing.recorder import END_NS, ServerSpan, answered
from fnrt.tracing.spans import Tracing, fail

log = logging.getLogger("fnrt.telemetry")

#: A lone request's reports (``Telemetry.deferred``) wait at most this long for the
#: event loop to hand a batch to a worker process before they are made anyway.
SETTLE_AFTER_S = 0.005


@dataclass
class Telemetry:
    """Spans (``tracing``, possibly off), metrics, and the request log (None: off).

    Requests and batches that end are reported here, and made (metrics counted, log
    lines queued, spans ended and exported) together at a :meth:`flush` at the end of
    the event loop's turn. ``deferred``, a turn that ended one request and one batch
    (a lone request: one connection) leaves its reports to :meth:`settle_soon`, which
    the loop calls once it has handed the next batch to a worker process and waits
    for it, so that making them is on no request's path; or ``SETTLE_AFTER_S`` later,
    whichever comes first. What reads the reports (``/metrics``) settles first."""

    tracing: Tracing = field(default_factory=Tracing)
    metrics: Metrics = field(default_factory=lambda: Metrics(gpu=False))
    access: AccessLog | None = None
    #: a lone request's reports wait for :meth:`settle_soon` (or ``SETTLE_AFTER_S``)
    deferred: bool = True
    #: requests ended since the last :meth:`flush`
    ended: list[Ended] = field(default_factory=list)
    #: those of them whose spans are recorded, exported at once (:func:`answered`)
    spans: list[Ended] = field(default_factory=list)
    #: batches ended since the last :meth:`flush`
    batches: list[BatchEnded] = field(default_factory=list)
    _owed: bool = field(default=False, repr=False)  # reports not made yet
    _turn: bool = field(default=False, repr=False)  # the turn's end is to look at them
    _timer: asyncio.TimerHandle | None = field(default=None, repr=False)

    def _owe(self) -> None:
        """A report: the end of this turn makes it (or leaves a lone request's), after
        the answers set in it have been written: two turns on, as :meth:`settle_soon`
        (a batch's report comes before its answers' callbacks have run)."""
        self._owed = True
        if not self._turn:
            self._turn = True
            loop = asyncio.get_running_loop()
            loop.call_soon(loop.call_soon, self._turn_ended)

    def _turn_ended(self) -> None:
        self._turn = False
        if not self._owed:
            return
        if self.deferred and len(self.ended) <= 1 and len(self.batches) <= 1:
            if self._timer is None:  # one armed for an earlier report fires sooner
                self._timer = asyncio.get_running_loop().call_later(SETTLE_AFTER_S, self._timed)
            return
        self.flush()

    def _timed(self) -> None:
        self._timer = None
        self.settle()

    def settle(self) -> None:
        """Make the reports owed now (cheap when none is)."""
        if self._owed:
            self.flush()

    def settle_soon(self) -> None:
        """Make the reports owed once the answers set by now have been written: two
        turns of the loop from here (an answer's callback runs in the next, and the
        connections' one write of the turn's answers is scheduled from it), so that
        making them delays no answer. Only a lone request's reports wait for it (their
        timer is armed); any other's the turn's end makes, so under load a batch sent
        schedules nothing."""
        if self._owed and self._timer is not None:
            loop = asyncio.get_running_loop()
            loop.call_soon(loop.call_soon, self.settle)

    def batch(
        self,
        function: str,
        size: int,
        compute_s: float,
        waits_s: Sequence[float],
        warm: int,
        span: Any = None,
        failure: BaseException | None = None,
        handler_spans: Sequence[Mapping[str, Any]] = (),
        end_ns: int = 0,
    ) -> None:
        """A batch ended (at ``end_ns``, ``time_ns``'s; 0: now): its metrics, its span
        (``span``, open while it ran: ended then, failed with ``failure``) and the spans
        its handler made, at the next flush."""
        self._owe()
        if span is not None:
            end_ns = end_ns or time_ns()
            if failure is not None:  # rare: now, its exception's event timed as it came
                fail(span, failure)
        self.batches.append((function, size, compute_s, waits_s, warm, span, handler_spans, end_ns))

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
        self._owe()
        ended = self.ended
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
        the tracer's export at once. The batches' first: their spans end as they ended."""
        self._owed = False
        timer = self._timer
        if timer is not None:  # made now: a lone request's timer has nothing left to make
            self._timer = None
            timer.cancel()
        batches, self.batches = self.batches, []
        try:
            if batches:
                self._batches(batches)
        finally:  # the requests' reports are made even if a batch's could not be
            self._requests()

    def _requests(self) -> None:
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

    def _batches(self, batches: list[BatchEnded]) -> None:
        metrics, tracing = self.metrics, self.tracing
        for function, size, compute_s, waits_s, warm, span, handler_spans, end_ns in batches:
            try:
                metrics.batch(function, size, compute_s, waits_s)
                metrics.warm_hits(warm)
                if not tracing.enabled:
                    continue
                tracing.record(handler_spans)  # the handler's own, children of the batch's span
                if span is not None:
                    span.end(end_ns)
            except Exception:  # this batch's report is lost, not the others' of the turn
                log.exception("reporting a batch of %s failed", function)

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
        self._turn = False  # a turn's end pending on a loop that may be closing
        try:  # (the flush cancels a lone request's timer)
            self.flush()
        finally:  # what is buffered is exported and written whatever the flush raised
            try:
                self.tracing.shutdown()
            finally:
                if self.access is not None:
                    self.access.close()


#: A batch as it ended: function, size, compute seconds, its requests' waits, how many
#: of them were warm, its span (None: not traced), its handler's spans, when it ended
#: (ns; 0 without a span).
BatchEnded = tuple[str, int, float, Sequence[float], int, Any, Sequence[Mapping[str, Any]], int]
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
