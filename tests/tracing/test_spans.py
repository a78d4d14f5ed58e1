"""Spans of real invokes against a real server, read from an in-memory exporter."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from fnrt.runtime import scheduler as sched
from fnrt.runtime.http.app import build_app
from fnrt.tracing.access import AccessLog
from fnrt.tracing.export import MemoryExporter
from fnrt.tracing.metrics import Metrics
from fnrt.tracing.recorder import Span, SpanKind, StatusCode
from fnrt.tracing.setup import TraceConfig, build_tracer
from fnrt.tracing.spans import Tracing
from fnrt.tracing.telemetry import Telemetry
from support import (
    LiveServer,
    gate,
    make_node,
    traced_server,
    wait_until,
    write_function,
)

X = [[1.0, 2.0, 3.0, 4.0]]

GATED = """
import fnrt_test_gates as gates

class Gated:
    def __call__(self, batch):
        gates.gate("release").wait(10)
        if gates.gate("fail").is_set():
            raise RuntimeError("the model broke")
        return [{"y": r["x"] * 2} for r in batch]
"""


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[tuple[LiveServer, MemoryExporter]]:
    with traced_server(tmp_path) as (server, exporter):
        folder = write_function(tmp_path / "src", "echo", GATED.replace("Gated", "Echo"))
        server.deploy(folder)
        gate("release").set()
        yield server, exporter


def by_name(spans: list[Span], name: str) -> list[Span]:
    return [s for s in list(spans) if s.name == name]


def test_one_invoke_makes_the_expected_tree(
    traced: tuple[LiveServer, MemoryExporter],
) -> None:
    server, exporter = traced
    with server.client() as c:
        r = c.post("/v1/functions/echo/invoke", json={"x": X})
    assert r.status_code == 200
    wait_until(lambda: len(by_name(exporter.spans, "encode")) == 1)
    spans = exporter.spans
    (root,) = by_name(spans, "POST /v1/functions/{name}/invoke")
    assert root.kind is SpanKind.SERVER and root.parent is None
    attributes = root.attributes
    assert attributes["http.request.method"] == "POST"
    assert attributes["http.route"] == "/v1/functions/{name}/invoke"
    assert attributes["url.path"] == "/v1/functions/echo/invoke"
    assert attributes["http.response.status_code"] == 200
    assert attributes["fnrt.function"] == "echo"
    assert attributes["fnrt.cold_start"] in ("l2", "l3")
    children = {s.name: s for s in spans if s.parent is not None}
    assert set(children) == {"queue", "load", "encode"}
    for child in children.values():
        assert child.parent is not None and child.parent.span_id == root.context.span_id
        assert child.context.trace_id == root.context.trace_id
        assert root.start_ns <= child.start_ns <= child.end_ns <= root.end_ns
    assert children["queue"].attributes == {"fnrt.priority": "normal"}
    assert children["encode"].attributes == {"fnrt.response.bytes": len(r.content)}
    assert children["queue"].end_ns <= children["encode"].start_ns
    load = children["load"].attributes
    assert load["fnrt.load.tier"] == attributes["fnrt.cold_start"]
    assert load["fnrt.load.bytes"] >= 0 and load["fnrt.load.total_s"] > 0
    (batch,) = by_name(spans, "batch echo")
    assert [link.span_id for link in batch.links] == [root.context.span_id]
    # the response names the server span
    trace_id, span_id = f"{root.context.trace_id:032x}", f"{root.context.span_id:016x}"
    assert r.headers["traceresponse"] == f"00-{trace_id}-{span_id}-01"
    # a warm invoke has no load span
    exporter.clear()
    with server.client() as c:
        assert "x-fnrt-cold-start" not in c.post("/v1/functions/echo/invoke", json={"x": X}).headers
    wait_until(lambda: len(by_name(exporter.spans, "encode")) == 1)
    assert not by_name(exporter.spans, "load")


def test_the_callers_traceparent_becomes_the_parent(
    traced: tuple[LiveServer, MemoryExporter],
) -> None:
    server, exporter = traced
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    headers = {"traceparent": f"00-{trace_id}-{parent_id}-01", "tracestate": "vendor=1"}
    with server.client() as c:
        r = c.post("/v1/functions/echo/invoke", json={"x": X}, headers=headers)
    assert r.headers["traceresponse"].startswith(f"00-{trace_id}-")
    wait_until(lambda: bool(by_name(exporter.spans, "encode")))
    (root,) = by_name(exporter.spans, "POST /v1/functions/{name}/invoke")
    assert f"{root.context.trace_id:032x}" == trace_id
    assert root.parent is not None and f"{root.parent.span_id:016x}" == parent_id
    assert root.parent.remote
    assert root.context.trace_state == "vendor=1"


def test_one_batch_span_links_every_request_it_served(
    traced: tuple[LiveServer, MemoryExporter],
) -> None:
    server, exporter = traced
    with server.client() as c:
        c.post("/v1/functions/echo/invoke", json={"x": X})  # load it first
    # its spans leave at the end of the server's turn, which may come after the answer
    wait_until(lambda: len(by_name(exporter.spans, "encode")) == 1)
    gate("release").clear()
    exporter.clear()
    results: list[int] = []

    def call() -> None:
        with server.client() as c:
            results.append(c.post("/v1/functions/echo/invoke", json={"x": X}).status_code)

    first = threading.Thread(target=call)  # takes the instance; the rest queue behind it
    first.start()
    scheduler = server.call(server.registry.get("echo"))
    wait_until(lambda: sched.activity(scheduler).busy)
    rest = [threading.Thread(target=call) for _ in range(5)]
    for t in rest:
        t.start()
    wait_until(lambda: scheduler.batcher.queued == 5)
    gate("release").set()
    for t in [first, *rest]:
        t.join()
    assert results == [200] * 6
    wait_until(lambda: len(by_name(exporter.spans, "encode")) == 6)
    spans = exporter.spans
    roots = {s.context.span_id for s in by_name(spans, "POST /v1/functions/{name}/invoke")}
    batches = by_name(spans, "batch echo")
    assert sorted(len(b.links) for b in batches) == [1, 5]
    big = max(batches, key=lambda b: len(b.links))
    assert big.attributes["fnrt.batch.size"] == 5
    assert {link.span_id for b in batches for link in b.links} == roots


def test_an_error_invoke_records_the_exception(
    traced: tuple[LiveServer, MemoryExporter],
) -> None:
    server, exporter = traced
    gate("fail").set()
    try:
        with server.client() as c:
            r = c.post("/v1/functions/echo/invoke", json={"x": X})
            assert r.status_code == 500
            assert c.post("/v1/functions/echo/invoke", json={"x": [[1]]}).status_code == 422
    finally:
        gate("fail").clear()
    wait_until(lambda: len(by_name(exporter.spans, "POST /v1/functions/{name}/invoke")) == 2)
    spans = exporter.spans
    failed, refused = by_name(spans, "POST /v1/functions/{name}/invoke")
    assert failed.status is StatusCode.ERROR
    (event,) = [e for e in failed.events if e[0] == "exception"]
    assert "the model broke" in str(event[2]["exception.message"])
    assert failed.attributes["http.response.status_code"] == 500
    (batch,) = by_name(spans, "batch echo")
    assert batch.status is StatusCode.ERROR
    assert any(e[0] == "exception" for e in batch.events)
    # a client error is not the server's fault: no error status, but its type is noted
    assert refused.status is StatusCode.UNSET
    assert refused.attributes["error.type"] == "InvalidInput"


def test_oip_infer_is_traced_too(traced: tuple[LiveServer, MemoryExporter]) -> None:
    server, exporter = traced
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": X[0]}]}
    with server.client() as c:
        assert c.post("/v2/models/echo/infer", json=body).status_code == 200
    wait_until(lambda: bool(by_name(exporter.spans, "POST /v2/models/{name}/infer")))


def test_the_request_log_names_the_trace_the_answer_names(tmp_path: Path) -> None:
    """A traced request's log line carries its trace's and span's ids, cut from its
    span's ``traceparent`` when its turn ends: the ``traceresponse`` header's and the
    exported server span's."""
    log = io.BytesIO()
    exporter = MemoryExporter()
    telemetry = Telemetry(
        Tracing(build_tracer(TraceConfig(), exporter, batch=False)),
        Metrics(gpu=False),
        AccessLog(log, 60.0),
    )
    node = make_node(tmp_path, telemetry=telemetry)
    server = LiveServer(build_app(node.settings, node)).start()
    try:
        folder = write_function(tmp_path / "src", "echo", GATED.replace("Gated", "Echo"))
        server.deploy(folder)
        gate("release").set()
        with server.client() as c:
            answers = [c.post("/v1/functions/echo/invoke", json={"x": X}) for _ in range(2)]
        wait_until(lambda: len(by_name(exporter.spans, "encode")) == 2)
    finally:
        server.stop()
    assert telemetry.access is not None
    telemetry.access.flush()
    lines = [orjson.loads(line) for line in log.getvalue().splitlines()]
    logged = [
        (line["trace_id"], line["span_id"]) for line in lines if line["route"].endswith("invoke")
    ]
    named = [tuple(a.headers["traceresponse"].split("-")[1:3]) for a in answers]
    roots = by_name(exporter.spans, "POST /v1/functions/{name}/invoke")
    exported = [(f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}") for s in roots]
    assert logged == named == exported
    assert lines[-1]["status"] == 200 and "cold_start" not in lines[-1]
    assert lines[-2]["cold_start"] in ("l2", "l3")  # the first: a cold start's line
