from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from fnrt.tracing.export import BatchExporter, MemoryExporter
from fnrt.tracing.recorder import (
    Flat,
    Sampler,
    SpanContext,
    Tracer,
    as_span,
    format_traceparent,
    parse_traceparent,
)
from fnrt.tracing.setup import TraceConfig
from support import wait_until

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        (f"00-{TRACE}-00f067aa0ba902b7-01", True),
        (f"00-{TRACE.upper()}-00F067AA0BA902B7-00", True),
        (f"01-{TRACE}-00f067aa0ba902b7-01-future", True),  # later versions may add fields
        (f"00-{TRACE}-00f067aa0ba902b7-01-extra", False),
        (f"ff-{TRACE}-00f067aa0ba902b7-01", False),
        (f"00-{'0' * 32}-00f067aa0ba902b7-01", False),
        (f"00-{TRACE}-{'0' * 16}-01", False),
        ("00-abc-def-01", False),
        ("", False),
    ],
)
def test_traceparent_parsing(header: str, ok: bool) -> None:
    context = parse_traceparent(header, "a=1")
    assert (context is not None) == ok
    if context is not None:
        assert context.trace_id == int(TRACE, 16) and context.remote
        assert context.sampled == header.endswith("01") or "future" in header
        assert context.trace_state == "a=1"
        assert format_traceparent(context)[3:35] == TRACE


def test_ratio_sampling_follows_the_trace_id_and_the_parent() -> None:
    half = Sampler(TraceConfig(sampler="parentbased_traceidratio", sampler_ratio=0.5))
    assert half.sampled((1 << 64) + 1, None)  # low 64 bits under 2^63
    assert not half.sampled((1 << 63) + 5, None)
    remote_yes = SpanContext(5, 6, sampled=True, remote=True)
    remote_no = SpanContext((1 << 63) + 5, 6, sampled=False, remote=True)
    assert half.sampled(7 << 63, remote_yes) and not half.sampled(5, remote_no)
    plain = Sampler(TraceConfig(sampler="traceidratio", sampler_ratio=0.5))
    assert not plain.sampled((1 << 63) + 5, remote_yes)  # ignores the parent
    assert Sampler(TraceConfig(sampler="always_off")).sampled(1, None) is False
    assert Sampler(TraceConfig(sampler="always_on")).sampled((1 << 64) - 1, None)


def test_only_sampled_spans_reach_the_sink() -> None:
    got: list[Flat] = []
    tracer = Tracer(TraceConfig(sampler="always_off"), got.append)
    span = tracer.start("x")
    span.end()
    assert not span.recording and got == []
    tracer = Tracer(TraceConfig(), got.append)
    root = tracer.start("root")
    child = tracer.start("child", root.context)
    child.end()
    child.end()  # a second end is ignored
    root.end()
    assert [as_span(s).name for s in got] == ["child", "root"]
    assert child.parent == root.context and child.context.trace_id == root.context.trace_id


def test_batch_exporter_ships_everything_and_bounds_its_queue() -> None:
    memory = MemoryExporter()
    batcher = BatchExporter(memory, interval_s=0.05, batch_size=10, max_queued=1000)
    tracer = Tracer(TraceConfig(), batcher.add, batcher.shutdown)
    for i in range(25):
        tracer.start(f"s{i}").end()
    wait_until(lambda: len(memory.spans) == 25)
    blocked = BatchExporter(MemoryExporter(), interval_s=60, batch_size=10_000, max_queued=5)
    for _ in range(8):
        Tracer(TraceConfig(), blocked.add).start("x").end()
    assert blocked.dropped == 3
    blocked.shutdown()
    tracer.shutdown()


def test_batch_exporter_looks_often_while_spans_keep_coming() -> None:
    """The request path never wakes the export thread: it looks every
    ``busy_interval_s`` while spans keep coming (every ``interval_s`` when idle),
    so a steady stream goes out in many small exports, not one a second."""
    calls: list[int] = []

    class Counting(MemoryExporter):
        def export(self, spans: Sequence[Flat]) -> None:
            calls.append(len(spans))
            super().export(spans)

    exporter = Counting()
    batcher = BatchExporter(exporter, interval_s=0.3, busy_interval_s=0.01, max_queued=100_000)
    tracer = Tracer(TraceConfig(), batcher.add)
    started = time.monotonic()
    sent = 0
    while time.monotonic() - started < 1.0:  # a steady stream for a second
        tracer.start("s").end()
        sent += 1
        time.sleep(0.001)
    wait_until(lambda: sum(calls) == sent)
    batcher.shutdown()
    assert len(exporter.spans) == sent
    assert len(calls) >= 8  # every 0.3 s alone would make 4 at most
