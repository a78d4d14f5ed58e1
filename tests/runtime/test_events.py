"""The queue and load spans :class:`TelemetryEvents` keeps on a batch's requests, no server."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from fnrt.runtime.events import TelemetryEvents
from fnrt.runtime.queue import Call, Priority
from fnrt.tracing.config import TraceConfig
from fnrt.tracing.metrics import Metrics
from fnrt.tracing.recorder import Flat, ServerSpan, Tracer
from fnrt.tracing.spans import Tracing
from fnrt.tracing.telemetry import Telemetry

HTTP = ("POST", "/v1/functions/{name}/invoke", "/v1/functions/f/invoke", "")


def test_a_batch_keeps_each_recorded_requests_queue_wait_and_load() -> None:
    """Requests recorded or not (a ratio sampler), untraced, cold or warm, in one batch:
    each recorded one gets its queue wait (its arrival, the batch's start, its
    priority) and, when cold, the load it waited for; the batch's span links to
    exactly those; the others are left as they were. And a batch of recorded ones
    only (tracing at 100%), and a batch of one, the same."""
    ended: list[Flat] = []
    on = Tracer(TraceConfig(), ended.append)
    off = Tracer(TraceConfig(sampler="traceidratio", sampler_ratio=0.0), ended.append)
    events = TelemetryEvents(Telemetry(tracing=Tracing(on), metrics=Metrics(gpu=False)))
    vm: Any = SimpleNamespace(name="f", version="v-1")
    instance: Any = SimpleNamespace(timings_s={"total_s": 0.5}, tier="l2", size_bytes=10)
    events.loaded(vm, instance, 1, 3)
    loop = asyncio.new_event_loop()

    def call(span: ServerSpan | None, enqueued_ns: int, **extra: Any) -> Call:
        return Call({}, loop.create_future(), 0.0, span=span, enqueued_ns=enqueued_ns, **extra)

    try:
        cold, unsampled, warm = on.start_server(HTTP), off.start_server(HTTP), on.start_server(HTTP)
        assert not unsampled.recording
        batch = [
            call(cold, 5, cold=True),
            call(unsampled, 6, cold=True),
            call(None, 0),
            call(warm, 7, priority=Priority.HIGH),
        ]
        span = events.batch_started(vm, batch, 10)
        assert span.links == [cold.context, warm.context]
        assert span.attributes["fnrt.batch.size"] == 2
        assert (cold.queued, warm.queued, unsampled.queued) == (
            (5, 10, "normal"),
            (7, 10, "high"),
            None,
        )
        load = {"fnrt.load.tier": "l2", "fnrt.load.bytes": 10, "fnrt.load.total_s": 0.5}
        assert cold.children == (("load", 1, 3, load),)
        assert warm.children == () and unsampled.children == ()
        first, second, third = (on.start_server(HTTP) for _ in range(3))
        span = events.batch_started(
            vm,
            [call(first, 1, priority=Priority.LOW), call(second, 2, cold=True), call(third, 3)],
            4,
        )
        assert span.links == [first.context, second.context, third.context]
        assert (first.queued, second.queued, third.queued) == (
            (1, 4, "low"),
            (2, 4, "normal"),
            (3, 4, "normal"),
        )
        assert first.children == third.children == () and second.children == (("load", 1, 3, load),)
        lone = on.start_server(HTTP)  # a batch of one: the plain loop, the same
        span = events.batch_started(vm, [call(lone, 2, cold=True)], 3)
        assert span.links == [lone.context] and lone.queued == (2, 3, "normal")
        assert lone.children == (("load", 1, 3, load),)
        assert events.batch_started(vm, [call(None, 0), call(unsampled, 3)], 4) is None
    finally:
        loop.close()


def test_a_deleted_functions_last_reports_are_made_before_its_series_go() -> None:
    """A lone request's reports wait (``Telemetry.deferred``); a function deleted
    meanwhile has them made first, so they do not bring its series back after
    ``Metrics.forget``."""
    telemetry = Telemetry(metrics=Metrics(gpu=False))
    events = TelemetryEvents(telemetry)
    vm: Any = SimpleNamespace(name="gone", version="v-1")

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        call = Call({}, loop.create_future(), 0.0)
        events.batch(vm, [call], [0.001], 0, 0.002, None)
        telemetry.request("/r", "gone", "v-1", 200, 0.003, None)
        for _ in range(3):
            await asyncio.sleep(0)  # the turn's end: a lone request's, left
        assert telemetry.batches and telemetry.ended
        events.deleted("gone")
        await asyncio.sleep(0.02)  # past SETTLE_AFTER_S

    asyncio.run(scenario())
    assert ("gone",) not in telemetry.metrics.batch_size.series
    assert not any(labels[0] == "gone" for labels in telemetry.metrics.requests.values)
