from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from fnrt.tracing.export import BatchExporter, MemoryExporter, span_dict
from fnrt.tracing.recorder import (
    Flat,
    Sampler,
    SpanContext,
    Tracer,
    as_span,
    expand,
    format_traceparent,
    parse_traceparent,
)
from fnrt.tracing.setup import TraceConfig
from fnrt.tracing.spans import Tracing, fail, ids
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


def test_a_traced_requests_exported_spans_are_pinned() -> None:
    """Everything a trace shows of one request, pinned whole (names, kinds, ids, parent
    and child links, times, attributes, events, status): a request span from the
    caller's trace with its queue wait, the load it waited for and its encoding; a
    new trace's that failed; and the batch span linking both. However a request's
    span is kept on the request path, its export must read the same."""
    ended: list[Flat] = []
    tracing = Tracing(Tracer(TraceConfig(), ended.append))
    remote = {"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01", "tracestate": "k=v"}
    served = tracing.server_span("POST", "/v1/functions/{name}/invoke", "/v1/f/mlp", remote)
    failed = tracing.server_span("POST", "/v2/models/{name}/infer", "/v2/m", {"user-agent": "t"})
    assert served is not None and failed is not None
    assert served.recording and served.parent == parse_traceparent(remote["traceparent"], "k=v")
    assert served.traceparent == format_traceparent(served.context)
    assert ids(served) == (TRACE, f"{served.context.span_id:016x}")
    served.queued = (served.start_ns + 1, served.start_ns + 5, "high")
    tracing.after(
        served, "load", served.start_ns + 2, served.start_ns + 4, {"fnrt.load.tier": "l2"}
    )
    batch = tracing.batch_span("mlp", "v-1", [served.context, failed.context], served.start_ns + 5)
    assert batch is not None
    served.encoded = (served.start_ns + 6, served.start_ns + 7, 4096)
    fail(failed, RuntimeError("boom"))
    failed.set_attribute("fnrt.split", 2)
    batch.end(served.start_ns + 6)
    failed.finish(500, "mlp", "v-1")
    served.finish(200, "mlp", "v-1", "l2")
    served.finish(404, "other", "v-2")  # ended once: it keeps what it had
    tracing.after(served, "late", served.start_ns + 8, served.start_ns + 9, {})  # alone now
    exported = [span_dict(as_span(s)) for item in ended for s in expand(item)]
    for span in exported:  # a child's own id is drawn at export; its parent is pinned
        if span["name"] in ("queue", "load", "encode", "late"):
            assert span.pop("span_id") not in ("0" * 16, served.context.span_id)
    s0, f0 = served.start_ns, failed.start_ns
    server_id, failed_id = f"{served.context.span_id:016x}", f"{failed.context.span_id:016x}"
    trace_of_failed = f"{failed.context.trace_id:032x}"

    def child(name: str, start: int, end: int, attributes: dict[str, object]) -> dict[str, object]:
        return {
            "name": name,
            "trace_id": TRACE,
            "parent_id": server_id,
            "kind": "internal",
            "start_ns": s0 + start,
            "duration_ms": round((end - start) / 1e6, 3),
            "attributes": attributes,
            "links": [],
            "events": [],
            "status": "unset",
        }

    assert exported == [
        {
            "name": "batch mlp",
            "trace_id": f"{batch.context.trace_id:032x}",
            "span_id": f"{batch.context.span_id:016x}",
            "parent_id": None,
            "kind": "internal",
            "start_ns": s0 + 5,
            "duration_ms": 0.0,
            "attributes": {"fnrt.function": "mlp", "fnrt.version": "v-1", "fnrt.batch.size": 2},
            "links": [server_id, failed_id],
            "events": [],
            "status": "unset",
        },
        {
            "name": "POST /v2/models/{name}/infer",
            "trace_id": trace_of_failed,
            "span_id": failed_id,
            "parent_id": None,
            "kind": "server",
            "start_ns": f0,
            "duration_ms": round((failed.end_ns - f0) / 1e6, 3),
            "attributes": {
                "http.request.method": "POST",
                "http.route": "/v2/models/{name}/infer",
                "url.path": "/v2/m",
                "url.scheme": "http",
                "user_agent.original": "t",
                "http.response.status_code": 500,
                "fnrt.function": "mlp",
                "fnrt.version": "v-1",
                "error.type": "RuntimeError",
                "fnrt.split": 2,
            },
            "links": [],
            "events": [
                {
                    "name": "exception",
                    "attributes": {"exception.type": "RuntimeError", "exception.message": "boom"},
                }
            ],
            "status": "error",
        },
        {
            "name": "POST /v1/functions/{name}/invoke",
            "trace_id": TRACE,
            "span_id": server_id,
            "parent_id": "00f067aa0ba902b7",
            "kind": "server",
            "start_ns": s0,
            "duration_ms": round((served.end_ns - s0) / 1e6, 3),
            "attributes": {
                "http.request.method": "POST",
                "http.route": "/v1/functions/{name}/invoke",
                "url.path": "/v1/f/mlp",
                "url.scheme": "http",
                "http.response.status_code": 200,
                "fnrt.function": "mlp",
                "fnrt.version": "v-1",
                "fnrt.cold_start": "l2",
            },
            "links": [],
            "events": [],
            "status": "unset",
        },
        child("queue", 1, 5, {"fnrt.priority": "high"}),
        child("load", 2, 4, {"fnrt.load.tier": "l2"}),
        child("encode", 6, 7, {"fnrt.response.bytes": 4096}),
        child("late", 8, 9, {}),
    ]
    parents = [as_span(s).parent for item in ended for s in expand(item)]
    assert parents[2] is not None and parents[2].remote and parents[2].trace_state == "k=v"
    assert {as_span(s).context.trace_state for s in expand(ended[2])} == {"k=v"}


def test_a_requests_span_starts_as_its_headers_say() -> None:
    """``Tracer.start_request`` (the data path's way in, its common case built apart):
    a new trace without a caller's ``traceparent`` (absent, empty or malformed), the
    caller's trace when it sent one, and ratio sampling's unrecorded spans, each with
    its ids in its ``traceparent`` and its HTTP side kept."""
    ended: list[Flat] = []
    always = Tracer(TraceConfig(), ended.append)
    never = Tracer(TraceConfig(sampler="traceidratio", sampler_ratio=0.0), ended.append)
    agent = {"user-agent": "t"}
    caller = {"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01", "tracestate": "k=v", **agent}
    for headers in (agent, {"traceparent": "", **agent}, {"traceparent": "00-x-y-01", **agent}):
        span = always.start_request("POST", "/r/{name}", "/r/a", headers)
        assert (
            span.recording
            and span.parent is None
            and span.http == ("POST", "/r/{name}", "/r/a", "t")
        )
        assert span.traceparent == format_traceparent(span.context) and span.context.sampled
        assert span.context.trace_id and span.context.span_id and span.start_ns and not span.end_ns
    continued = always.start_request("GET", "/r", "/r", caller)
    assert continued.parent == parse_traceparent(caller["traceparent"], "k=v")
    assert f"{continued.context.trace_id:032x}" == TRACE and continued.context.trace_state == "k=v"
    assert continued.traceparent == format_traceparent(continued.context)
    unrecorded = never.start_request("GET", "/r", "/r", {})
    assert not unrecorded.recording and unrecorded.traceparent.endswith("-00")
    unrecorded.finish(200, "f", "v")
    continued.finish(200, "f", "v")
    assert [item[0] for item in ended] == [continued.context.trace_id]  # only the recorded
