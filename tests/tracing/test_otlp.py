"""The hand-written OTLP encoder, read back with the official protobuf classes."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from fnrt.tracing.otlp import encode_request
from fnrt.tracing.recorder import SpanContext, SpanKind, StatusCode, Tracer, parse_traceparent
from fnrt.tracing.setup import TraceConfig


def test_spans_decode_with_the_official_schema() -> None:
    ended = []
    tracer = Tracer(TraceConfig(), ended.append)
    remote = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "k=v")
    assert remote is not None
    root = tracer.start(
        "POST /v1/functions/{name}/invoke",
        remote,
        kind=SpanKind.SERVER,
        attributes={"http.route": "/v1/functions/{name}/invoke", "http.response.status_code": 500},
    )
    root.set_attribute("fnrt.load.total_s", 0.25)
    root.set_attribute("fnrt.ok", False)
    root.set_attribute("fnrt.big", -(2**40))
    root.set_attribute("fnrt.tiers", ["l2", "l3"])
    root.record_exception(RuntimeError("boom"))
    root.set_status(StatusCode.ERROR, "boom")
    root.end(root.start_ns + 1_000)
    batch = tracer.start("batch echo", links=[root.context], attributes={"fnrt.batch.size": 1})
    batch.end()
    data = encode_request(ended, {"service.name": "fnrt-test"})
    request = ExportTraceServiceRequest()
    request.ParseFromString(data)
    (resource,) = request.resource_spans
    assert resource.resource.attributes[0].value.string_value == "fnrt-test"
    (scope,) = resource.scope_spans
    assert scope.scope.name == "fnrt"
    first, second = scope.spans
    assert first.name == "POST /v1/functions/{name}/invoke"
    assert first.trace_id.hex() == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert first.parent_span_id.hex() == "00f067aa0ba902b7"
    assert first.span_id == root.context.span_id.to_bytes(8, "big")
    assert first.trace_state == "k=v"
    assert first.kind == ProtoSpan.SPAN_KIND_SERVER
    assert first.end_time_unix_nano - first.start_time_unix_nano == 1_000
    values = {a.key: a.value for a in first.attributes}
    assert values["http.route"].string_value == "/v1/functions/{name}/invoke"
    assert values["http.response.status_code"].int_value == 500
    assert values["fnrt.load.total_s"].double_value == 0.25
    assert values["fnrt.ok"].HasField("bool_value") and not values["fnrt.ok"].bool_value
    assert values["fnrt.big"].int_value == -(2**40)
    assert [v.string_value for v in values["fnrt.tiers"].array_value.values] == ["l2", "l3"]
    (event,) = first.events
    assert event.name == "exception"
    assert {a.key: a.value.string_value for a in event.attributes}["exception.message"] == "boom"
    assert first.status.code == Status.STATUS_CODE_ERROR and first.status.message == "boom"
    assert first.flags == 0x301  # sampled, parent known to be remote
    assert second.name == "batch echo" and not second.parent_span_id
    (link,) = second.links
    assert link.span_id == first.span_id and link.trace_id == first.trace_id


def test_context_defaults() -> None:
    context = SpanContext(1, 2, sampled=False)
    assert context.flags == 0 and not context.remote
