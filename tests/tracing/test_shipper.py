"""The shipper process: the server's spans, encoded and posted outside its GIL."""

from __future__ import annotations

import enum
import marshal
import os
import resource
import signal
from typing import Any

import pytest

from fnrt.tracing.recorder import SpanKind, Tracer
from fnrt.tracing.setup import TraceConfig, build_tracer
from fnrt.tracing.shipper import ShippedExporter, _waiting, serve
from fnrt.tracing.spans import Tracing
from support import OtlpCollector, wait_until


def received(collector: OtlpCollector) -> dict[str, Any]:
    """Every span the collector got, by name."""
    return {span.name: span for _, span in collector.spans()}


class Tier(enum.StrEnum):
    L2 = "l2"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_spans_and_records_reach_the_collector_whole(collector: OtlpCollector) -> None:
    exporter = ShippedExporter(collector.url, {"service.name": "fnrt-shipped"})
    tracer = Tracer(TraceConfig(), lambda flat: exporter.export([flat]))
    root = tracer.start("POST /v1/functions/{name}/invoke", kind=SpanKind.SERVER)
    root.set_attribute("http.response.status_code", 200)
    root.set_attribute("fnrt.cold_start", Tier.L2)  # a str enum: marshal takes no subclass
    root.after("queue", root.start_ns, root.start_ns + 5, {"fnrt.priority": "high"})
    root.end()
    request = Tracing(tracer).server_span("GET", "/v1/functions/{name}", "/v1/functions/f", {})
    request.finish(200, "f", "v-1", Tier.L2)  # kept as fields, with an enum
    exporter.shutdown()  # the shipper posts what it read, then exits
    spans = received(collector)
    server, queue = spans["POST /v1/functions/{name}/invoke"], spans["queue"]
    values = {a.key: a.value for a in spans["GET /v1/functions/{name}"].attributes}
    assert values["fnrt.cold_start"].string_value == "l2"
    assert values["url.path"].string_value == "/v1/functions/f"
    assert {service for service, _ in collector.spans()} == {"fnrt-shipped"}
    values = {a.key: a.value for a in server.attributes}
    assert values["http.response.status_code"].int_value == 200
    assert values["fnrt.cold_start"].string_value == "l2"
    assert queue.parent_span_id == root.context.span_id.to_bytes(8, "big")
    assert queue.trace_id == root.context.trace_id.to_bytes(16, "big")
    assert exporter.dropped == 0


def test_a_shipper_that_dies_is_started_again_and_the_gap_is_counted(
    collector: OtlpCollector,
) -> None:
    clock = Clock()
    exporter = ShippedExporter(collector.url, {}, restart_interval_s=10, clock=clock)
    tracer = Tracer(TraceConfig(), lambda flat: exporter.export([flat]))
    first = exporter._process
    assert first is not None
    first.kill()
    first.wait()
    tracer.start("lost").end()  # too soon after the last start: dropped, counted
    assert exporter.dropped == 1 and exporter.starts == 1
    clock.now = 11
    tracer.start("kept").end()
    assert exporter.starts == 2
    exporter.shutdown()
    assert "kept" in received(collector) and "lost" not in received(collector)


def test_the_shipper_ignores_ctrl_c_and_leaves_when_the_server_does(
    collector: OtlpCollector,
) -> None:
    """A Ctrl-C reaches the whole process group: the server's shutdown, not the signal,
    ends the shipper, so the spans of the requests it drained still go out."""
    exporter = ShippedExporter(collector.url, {})
    process = exporter._process
    assert process is not None
    wait_until(lambda: _signal_ignored(process.pid, signal.SIGINT), 30)
    os.kill(process.pid, signal.SIGINT)
    tracer = Tracer(TraceConfig(), lambda flat: exporter.export([flat]))
    tracer.start("after ctrl-c").end()
    exporter.shutdown()
    assert process.returncode == 0
    assert "after ctrl-c" in received(collector)


def _signal_ignored(pid: int, signum: int) -> bool:
    """Whether process ``pid`` ignores ``signum`` (its SigIgn mask in /proc)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) & (1 << (signum - 1)))
    return False


def test_a_bad_endpoint_is_refused_before_any_process_starts() -> None:
    with pytest.raises(ValueError, match="not an http"):
        ShippedExporter("ftp://collector", {})


def _frame(*spans: tuple[object, ...]) -> bytes:
    body = marshal.dumps(list(spans))
    return len(body).to_bytes(4, "little") + body


def test_frames_waiting_go_in_one_post_up_to_a_bound_and_the_rest_at_the_end() -> None:
    """Frames already written are posted together (at most ``max_spans`` spans a post);
    a stream that ends mid-frame ends the reading, and what was read is still posted."""
    read, write = os.pipe()
    spans = [("queue", 1, 2, "", i, i + 1, {}) for i in range(5)]
    with os.fdopen(write, "wb") as out:
        for span in spans:
            out.write(_frame(span))
        out.write(b"\x10\x00\x00\x00partial")
    got: list[list[tuple[object, ...]]] = []
    serve(read, lambda batch: got.append(list(batch)), max_spans=2)
    os.close(read)
    assert got == [spans[0:2], spans[2:4], spans[4:5]]


def test_a_frame_alone_is_posted_at_once() -> None:
    read, write = os.pipe()
    got: list[list[tuple[object, ...]]] = []
    with os.fdopen(write, "wb") as out:
        out.write(_frame(("a", 1, 2, "", 3, 4, {})) + _frame(("b", 1, 2, "", 3, 4, {})))
    serve(read, lambda batch: got.append(list(batch)), waiting=lambda fd, timeout_s: False)
    os.close(read)
    assert [[s[0] for s in batch] for batch in got] == [["a"], ["b"]]


def test_frames_within_the_hold_go_in_one_post() -> None:
    """The shipper waits for the next frame as long as is left of ``hold_s`` from the
    first frame of the post, and posts the frames that came meanwhile together."""
    read, write = os.pipe()
    os.write(write, _frame(("a", 1, 2, "", 3, 4, {})))
    clock = Clock()
    asked: list[float] = []

    def waiting(fd: int, timeout_s: float) -> bool:
        asked.append(timeout_s)
        if len(asked) == 1:  # the next frame comes while the shipper waits
            clock.now = 0.2
            os.write(write, _frame(("b", 1, 2, "", 3, 4, {})))
            return True
        clock.now = 0.5
        os.close(write)  # the stream ends after the post
        return False  # nothing more within the hold: post

    got: list[list[tuple[object, ...]]] = []
    serve(read, lambda batch: got.append(list(batch)), waiting=waiting, hold_s=0.5, clock=clock)
    assert asked == pytest.approx([0.5, 0.3])
    os.close(read)
    assert [[s[0] for s in batch] for batch in got] == [["a", "b"]]


def test_a_server_ships_and_a_client_encodes_in_its_own_thread(collector: OtlpCollector) -> None:
    config = TraceConfig(exporter="otlp", endpoint=collector.url)
    server = build_tracer(config, shipped=True)
    client = build_tracer(config)
    assert server is not None and client is not None
    server.start("served").end()
    client.start("called").end()
    server.shutdown()
    client.shutdown()
    assert {"served", "called"} <= set(received(collector))


def test_waiting_frames_are_seen_on_a_descriptor_past_1023() -> None:
    """A server with many connections open hands the shipper a high descriptor only in
    tests, but ``select`` would refuse it outright: the check uses ``poll``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1100:
        pytest.skip(f"this process may open only {hard} files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1100), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1030)]
    try:
        read, write = os.pipe()
        assert read > 1023
        assert not _waiting(read)
        os.write(write, b"x")
        assert _waiting(read)
        os.close(read)
        os.close(write)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
