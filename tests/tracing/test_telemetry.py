"""Requests' metrics and log lines made together (``Telemetry.request`` then ``flush``,
at the end of the event loop's turn or, deferred, while it waits for a worker) are those
made one request at a time (``Metrics.request``, ``AccessLog.request``)."""

from __future__ import annotations

import asyncio
import io
import time
from typing import Any

import orjson
import pytest

from fnrt.tracing.access import AccessLog
from fnrt.tracing.config import TraceConfig
from fnrt.tracing.export import BatchExporter, MemoryExporter
from fnrt.tracing.metrics import Metrics
from fnrt.tracing.recorder import (
    END_NS,
    Flat,
    ServerSpan,
    SpanContext,
    Tracer,
    format_traceparent,
    server_span,
)
from fnrt.tracing.spans import Tracing, fail
from fnrt.tracing.telemetry import SETTLE_AFTER_S, Telemetry

HTTP = ("POST", "/v1/functions/{name}/invoke", "/v1/functions/a/invoke", "")


def _span(trace_id: str, span_id: str, sink: Any = None) -> ServerSpan:
    """A server span with these ids (recorded into ``sink``, when given)."""
    context = SpanContext(int(trace_id, 16), int(span_id, 16), True)
    return server_span(context, None, format_traceparent(context), HTTP, 1, sink)


ENDED: list[tuple[str, str, str, int, float, str | None, tuple[str, str] | None]] = [
    ("/v1/functions/{name}/invoke", "a", "v-1", 200, 0.0012, None, None),
    ("/v1/functions/{name}/invoke", "a", "v-1", 200, 0.0450, None, None),
    ("/v1/functions/{name}/invoke", "a", "v-1", 429, 0.0001, None, None),
    ("/v1/functions/{name}/invoke", "a", "v-1", 200, 0.0031, None, ("12" * 16, "34" * 8)),
    ("/v2/models/{name}/infer", "b", "v-9", 200, 1.5, "L2", ("ab" * 16, "cd" * 8)),
]


async def _turn_end() -> None:
    """The end of the event loop's turn, as the reports made then see it: two turns on
    (``Telemetry._owe``: after the answers set in it have been written)."""
    for _ in range(2):
        await asyncio.sleep(0)


def _lines(stream: io.BytesIO) -> list[dict[str, Any]]:
    lines = [orjson.loads(line) for line in stream.getvalue().splitlines()]
    for line in lines:
        del line["ts"]  # the clock's
    return lines


def _one_by_one(log: io.BytesIO) -> Telemetry:
    """Telemetry that made its metrics and log lines (into ``log``) of ENDED's requests
    one at a time, with no turn: what a turn's are compared with."""
    telemetry = Telemetry(metrics=Metrics(gpu=False), access=AccessLog(log, 60.0))
    assert telemetry.access is not None
    for route, function, version, status, seconds, cold, trace in ENDED:
        telemetry.metrics.request(function, version, status, seconds)
        telemetry.access.request(route, function, version, status, seconds, cold, trace)
    return telemetry


def test_a_turns_requests_make_what_each_request_made_alone() -> None:
    one_by_one, together = io.BytesIO(), io.BytesIO()
    alone = _one_by_one(one_by_one)
    batched = Telemetry(
        metrics=Metrics(gpu=False), access=AccessLog(together, 60.0), deferred=False
    )

    async def turn() -> None:
        for *ended, trace in ENDED:  # a traced request's ids come from its span
            batched.request(*ended, None if trace is None else _span(*trace))  # type: ignore[arg-type]
        assert len(batched.ended) == len(ENDED)  # nothing made yet: an append each
        await _turn_end()  # the end of the turn
        assert batched.ended == []

    asyncio.run(turn())
    assert batched.metrics.requests.values == alone.metrics.requests.values
    assert batched.metrics.request_seconds.series == alone.metrics.request_seconds.series
    alone.close()
    batched.close()
    assert _lines(together) == _lines(one_by_one)  # in order, a cold start among them
    assert {"cold_start": "L2", "trace_id": "ab" * 16}.items() <= _lines(together)[-1].items()


def test_a_turn_with_one_request_makes_what_it_made_alone() -> None:
    """A lone request's turn (one connection) takes the short way: the same metrics and
    log lines."""
    one_by_one, lone = io.BytesIO(), io.BytesIO()
    reference = _one_by_one(one_by_one)
    each = Telemetry(metrics=Metrics(gpu=False), access=AccessLog(lone, 60.0), deferred=False)

    async def turns() -> None:
        for *ended, trace in ENDED:
            each.request(*ended, None if trace is None else _span(*trace))  # type: ignore[arg-type]
            assert len(each.ended) == 1
            await _turn_end()  # the end of its turn

    asyncio.run(turns())
    assert each.metrics.requests.values == reference.metrics.requests.values
    assert each.metrics.request_seconds.series == reference.metrics.request_seconds.series
    reference.close()
    each.close()
    assert _lines(lone) == _lines(one_by_one)


def test_a_turns_request_spans_are_exported_at_its_end_and_bounded() -> None:
    """Requests' spans ended on the data path (``Telemetry.request``) reach the exporter
    together at the end of their turn, bounded as one at a time are (past
    ``max_queued``, dropped and counted); an unsampled one makes none."""
    memory = MemoryExporter()
    batcher = BatchExporter(memory, interval_s=60, max_queued=3)
    tracer = Tracer(TraceConfig(), batcher.add, batcher.shutdown, batcher.add_many)
    telemetry = Telemetry(tracing=Tracing(tracer), metrics=Metrics(gpu=False), deferred=False)
    unsampled = Tracer(TraceConfig(sampler="traceidratio", sampler_ratio=0.0), batcher.add)
    http = ("POST", "/v1/functions/{name}/invoke", "/v1/functions/a/invoke", "")

    async def turn(n: int) -> None:
        for span in [tracer.start_server(http) for _ in range(n)] + [unsampled.start_server(http)]:
            telemetry.request(http[1], "a", "v-1", 200, 0.001, None, span)
        assert len(telemetry.spans) == n  # nothing handed over yet
        await _turn_end()  # the end of the turn
        assert telemetry.spans == []

    asyncio.run(turn(2))
    assert memory.spans == [] and batcher.dropped == 0  # in the exporter's queue
    asyncio.run(turn(2))  # one fits, one is dropped
    assert batcher.dropped == 1
    telemetry.close()  # the exporter ships what it holds
    assert [s.attributes["http.response.status_code"] for s in memory.spans] == [200] * 3


@pytest.mark.parametrize("together", [True, False])
def test_a_turns_spans_end_as_each_would_have_ended_alone(together: bool) -> None:
    """The spans a turn's requests end with (``Telemetry.request``, made requests to
    export at the turn's end) are what ``ServerSpan.ended`` makes of each: what
    answered, a 5xx an error, attributes and exceptions set on one kept; a span ended
    already is not exported again, and an unsampled one not at all. Whether they end
    in one turn (the maps) or each in its own (one connection: a plain loop)."""
    exported: list[Flat] = []
    tracer = Tracer(TraceConfig(), exported.append, None, exported.extend)
    telemetry = Telemetry(tracing=Tracing(tracer), metrics=Metrics(gpu=False), deferred=False)
    reference: list[Flat] = []
    answers = [(200, "a", "v-1", None), (503, "a", "v-1", None), (200, "b", "v-2", "l2")]
    answers += [(500, "a", "v-1", None), (200, "a", "v-1", None)]
    pairs = [
        (
            _span(f"{i + 1:032x}", f"{i + 1:016x}", exported.append),
            _span(f"{i + 1:032x}", f"{i + 1:016x}", reference.append),
        )
        for i in range(len(answers))
    ]
    failed, twin = pairs[3]  # an error recorded on it, and an attribute
    fail(failed, RuntimeError("boom"))
    failed.set_attribute("fnrt.split", 2)
    twin[-1] = failed[-1]  # the same rare part (the exception's event has a time)
    for span in pairs[2]:
        span.queued = (2, 3, "high")
        span.encoded = (4, 5, 64)
    pairs[4][0].finish(404, "x", "v-0")  # ended already: it keeps what it had
    exported.clear()
    unsampled = _span("f" * 32, "f" * 16)  # no sink: not recorded

    async def turn() -> None:
        for (span, _), (status, function, version, cold) in zip(pairs, answers, strict=True):
            telemetry.request("/r", function, version, status, 0.001, cold, span)
            if not together:
                await _turn_end()  # the end of its own turn
        telemetry.request("/r", "a", "v-1", 200, 0.001, None, unsampled)
        assert together or len(exported) == 4
        assert not together or exported == []  # nothing made before the turn's end
        await _turn_end()

    asyncio.run(turn())
    for (_, twin), (status, function, version, cold) in zip(pairs[:4], answers[:4], strict=True):
        twin.finish(status, function, version, cold)
    assert all(span[END_NS] for span, _ in pairs) and not unsampled[END_NS]

    def timeless(flat: Flat) -> Flat:
        return (*flat[:END_NS], *flat[END_NS + 1 :])

    assert len(exported) == 4
    assert [timeless(f) for f in exported] == [timeless(f) for f in reference]
    assert exported[1][10][2] == exported[3][10][2] == 2  # 5xx: an error (StatusCode.ERROR)


def test_a_lone_requests_reports_wait_for_the_loop_to_wait_on_a_worker() -> None:
    """Deferred (the default), a turn that ended one request and its batch (one
    connection) leaves their reports to ``settle_soon`` (the loop handed the next batch
    to a worker) or, with nothing handed over, to ``SETTLE_AFTER_S`` later; a turn that
    ended more makes them at its end. The same metrics, log lines (in order) and spans;
    a batch's span ends when the batch did, not when it is made."""
    one_by_one, later = io.BytesIO(), io.BytesIO()
    reference = _one_by_one(one_by_one)
    exported: list[Flat] = []
    tracer = Tracer(TraceConfig(), exported.append, None, exported.extend)
    deferred = Telemetry(Tracing(tracer), Metrics(gpu=False), AccessLog(later, 60.0))
    assert deferred.deferred

    def report(ended: Any) -> None:
        *fields, trace = ended
        deferred.request(*fields, None if trace is None else _span(*trace))

    async def turns() -> None:
        report(ENDED[0])
        batch_span = tracer.start("batch")
        assert batch_span is not None
        deferred.batch("a", 3, 0.002, [0.001, 0.0, 0.0005], 2, batch_span)
        ended_ns = time.time_ns()
        await _turn_end()  # the turn's end: a lone request's, left
        assert len(deferred.ended) == 1 and len(deferred.batches) == 1 and exported == []
        await _turn_end()
        assert len(deferred.ended) == 1  # nothing handed over yet
        deferred.settle_soon()  # the loop handed a batch to a worker
        await asyncio.sleep(0)
        assert deferred.ended != []  # not before the answers set by now are written
        await asyncio.sleep(0)
        assert deferred.ended == [] and deferred.batches == [] and len(exported) == 1
        assert batch_span.end_ns <= ended_ns  # as the batch ended, not as it was made
        report(ENDED[1])
        await _turn_end()
        assert len(deferred.ended) == 1
        await asyncio.sleep(SETTLE_AFTER_S * 4)  # nothing handed over: made anyway
        assert deferred.ended == []
        for ended in ENDED[2:]:  # three in a turn: made at its end
            report(ended)
        await _turn_end()
        assert deferred.ended == []

    asyncio.run(turns())
    assert deferred.metrics.requests.values == reference.metrics.requests.values
    assert deferred.metrics.request_seconds.series == reference.metrics.request_seconds.series
    made = Metrics(gpu=False)  # the batch's, made at once
    made.batch("a", 3, 0.002, [0.001, 0.0, 0.0005])
    made.warm_hits(2)
    for name in ("batch_size", "compute_seconds", "queue_seconds"):
        assert getattr(deferred.metrics, name).series == getattr(made, name).series, name

    def hits(metrics: Metrics) -> list[Any]:
        samples = [s for m in metrics.tier_hits.collect() for s in m.samples]
        return [(s.name, s.labels, s.value) for s in samples if s.name.endswith("_total")]

    assert hits(deferred.metrics) == hits(made) != []
    reference.close()
    deferred.close()
    assert _lines(later) == _lines(one_by_one)


def test_a_batch_reported_after_it_ended_keeps_its_end_time() -> None:
    """A batch accounted after its answers were written (nothing queued behind it) is
    reported with the time it ended: its span ends then, not at the report."""
    exported: list[Flat] = []
    tracer = Tracer(TraceConfig(), exported.append, None, exported.extend)
    telemetry = Telemetry(Tracing(tracer), Metrics(gpu=False), None, deferred=False)

    async def turns() -> None:
        span = tracer.start("batch")
        assert span is not None
        ended_ns = time.time_ns()
        await asyncio.sleep(0.01)  # the answers written meanwhile
        telemetry.batch("a", 1, 0.002, [0.001], 1, span, end_ns=ended_ns)
        await _turn_end()
        assert telemetry.batches == [] and span.end_ns == ended_ns

    asyncio.run(turns())
    telemetry.close()


class Refused(Tracing):
    """A tracer that refuses a batch's handler spans (as a full or broken one might)."""

    @property
    def enabled(self) -> bool:
        return True

    def record(self, handler_spans: Any) -> None:
        if handler_spans:
            raise ValueError("refused")


def test_a_batch_report_that_fails_leaves_the_others_made(caplog: pytest.LogCaptureFixture) -> None:
    """A flush one of whose batches cannot be reported (a handler span the tracer
    refuses, say) logs that and still makes the other batches' reports and the
    requests' metrics and log lines, and owes nothing after."""
    log = io.BytesIO()
    telemetry = Telemetry(Refused(), Metrics(gpu=False), AccessLog(log, 60.0))

    async def scenario() -> None:
        telemetry.batch("a", 1, 0.001, [0.0], 1, None, None, [{"name": "x"}])
        telemetry.batch("b", 4, 0.002, [0.0] * 4, 4)
        telemetry.request("/r", "a", "v-1", 200, 0.001, None)
        telemetry.flush()
        assert telemetry.ended == [] and telemetry.batches == []
        telemetry.settle()  # nothing owed

    with caplog.at_level("ERROR", logger="fnrt.telemetry"):
        asyncio.run(scenario())
    assert "reporting a batch of a failed" in caplog.text
    assert ("b",) in telemetry.metrics.batch_size.series
    assert telemetry.metrics.requests.values == {("a", "v-1", "200"): 1.0}
    telemetry.close()
    assert [line["status"] for line in _lines(log)] == [200]


def test_close_exports_and_writes_what_is_buffered_whatever_the_flush_raised() -> None:
    """The server's last flush (``close``, at shutdown) raising still shuts the tracer
    down and writes the request log's buffered lines."""

    class Shut(Tracing):
        """Tracing that says whether it was shut down."""

        def __init__(self) -> None:
            super().__init__()
            self.shut = False

        def shutdown(self) -> None:
            self.shut = True

    class Breaking(AccessLog):
        """A request log that cannot take the lines after the first."""

        broken = False

        def requests(self, ended: Any) -> None:
            if self.broken:
                raise RuntimeError("the log is broken")
            super().requests(ended)

    log = io.BytesIO()
    tracing = Shut()
    access = Breaking(log, 60.0)
    telemetry = Telemetry(tracing, Metrics(gpu=False), access)

    async def scenario() -> None:
        telemetry.request("/r", "a", "v-1", 200, 0.001, None)
        await asyncio.sleep(SETTLE_AFTER_S * 4)  # made: its line is buffered
        access.broken = True
        telemetry.request("/r", "a", "v-1", 500, 0.001, None)

    asyncio.run(scenario())
    with pytest.raises(RuntimeError, match="broken"):
        telemetry.close()
    assert tracing.shut
    assert [line["status"] for line in _lines(log)] == [200]


def test_a_lone_request_is_reported_on_a_loop_after_one_that_closed_with_its_timer() -> None:
    """A lone request's timer left armed by a loop that closed (an embedding that runs
    the node on one loop after another) does not keep a later loop's lone requests
    from being reported once anything made the first one's."""
    telemetry = Telemetry(metrics=Metrics(gpu=False))

    async def lone() -> None:
        telemetry.request("/r", "a", "v-1", 200, 0.001, None)

    asyncio.run(lone())  # the loop closes with the timer armed
    telemetry.settle()

    async def later() -> None:
        telemetry.request("/r", "a", "v-1", 200, 0.001, None)
        await asyncio.sleep(SETTLE_AFTER_S * 10)

    asyncio.run(later())
    assert telemetry.metrics.requests.values[("a", "v-1", "200")] == 2
