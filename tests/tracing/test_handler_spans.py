"""Spans a handler makes through the OpenTelemetry API join the request's trace, under
the batch's span, whether the handler runs in a thread or in a worker process."""

from __future__ import annotations

from pathlib import Path

import pytest

from fnrt.tracing.recorder import SpanKind, StatusCode
from support import traced_server, wait_until, write_function

HANDLER = """
from opentelemetry import trace

tracer = trace.get_tracer("my-handler")

with tracer.start_as_current_span("at import"):  # outside any batch: not recorded
    pass


def handle(batch):
    with tracer.start_as_current_span("tokenize", kind=trace.SpanKind.CLIENT) as span:
        span.set_attribute("rows", len(batch))
        with tracer.start_as_current_span("lookup"):
            pass
    try:
        with tracer.start_as_current_span("flaky"):
            raise KeyError("missing")
    except KeyError:
        pass
    return [{"y": r["x"]} for r in batch]
"""

MANIFEST = """
name = "{name}"
handler = "handler:handle"

[inputs]
x = {{ dtype = "float32", shape = [-1, 4] }}

[outputs]
y = {{ dtype = "float32", shape = [-1, 4] }}

[isolation]
mode = "{mode}"
"""


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_handler_spans_are_children_of_the_batch(tmp_path: Path, mode: str) -> None:
    pytest.importorskip("opentelemetry.trace")
    folder = write_function(tmp_path / "src", "otel", HANDLER, MANIFEST, mode=mode)
    with traced_server(tmp_path) as (srv, exporter), srv.client() as c:
        srv.deploy(folder)
        r = c.post("/v1/functions/otel/invoke", json={"x": [[1, 2, 3, 4]]})
        assert r.status_code == 200, r.text
        wait_until(lambda: bool(exporter.named("lookup")) and bool(exporter.named("batch otel")))
    (batch,) = exporter.named("batch otel")
    (tokenize,) = exporter.named("tokenize")
    (lookup,) = exporter.named("lookup")
    (flaky,) = exporter.named("flaky")
    assert tokenize.context.trace_id == batch.context.trace_id == lookup.context.trace_id
    assert tokenize.parent is not None and tokenize.parent.span_id == batch.context.span_id
    assert lookup.parent is not None and lookup.parent.span_id == tokenize.context.span_id
    assert tokenize.attributes == {"rows": 1} and tokenize.kind is SpanKind.CLIENT
    assert batch.start_ns <= tokenize.start_ns <= tokenize.end_ns <= batch.end_ns
    assert flaky.status is StatusCode.ERROR
    assert [name for name, _, _ in flaky.events] == ["exception"]
    assert not exporter.named("at import")
