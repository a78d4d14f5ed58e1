"""The hand-written OTLP encoder, read back with the official protobuf classes."""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from fnrt.tracing import otlp
from fnrt.tracing.otlp import encode_request
from fnrt.tracing.recorder import (
    RECORD_FIELDS,
    REQUEST_FIELDS,
    ServerSpan,
    SpanContext,
    SpanKind,
    StatusCode,
    Tracer,
    as_span,
    parse_traceparent,
    span_of_request,
)
from fnrt.tracing.setup import TraceConfig
from fnrt.tracing.spans import Tracing, fail


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


def test_records_decode_as_children_of_their_request_span() -> None:
    """Spans made after the fact once their span has ended (queue, load, encode) travel
    as flat records of their own and are encoded straight from them: same tree, times
    and attributes as a span, with an id of their own drawn at export; a trace state and
    an unhashable attribute go too."""
    ended: list[object] = []
    tracer = Tracer(TraceConfig(), ended.append)
    remote = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "k=v")
    root = tracer.start("POST /v1/functions/{name}/invoke", remote, kind=SpanKind.SERVER)
    root.end()
    root.after("queue", 10, 25, {"fnrt.priority": "normal"})
    root.after("load", 11, 20, {"fnrt.load.tiers": ["l2"], "fnrt.load.s": 0.5})
    local = tracer.start("POST /v1/functions/{name}/invoke")
    local.end()
    local.after("encode", 30, 31, {"fnrt.response.bytes": 4096})
    records = [r for r in ended if len(r) == RECORD_FIELDS]  # type: ignore[arg-type]
    assert [r[0] for r in records] == ["queue", "load", "encode"]  # type: ignore[index]
    request = ExportTraceServiceRequest()
    request.ParseFromString(encode_request(ended, {"service.name": "fnrt-test"}))  # type: ignore[arg-type]
    spans = {s.name: s for s in request.resource_spans[0].scope_spans[0].spans}
    queue, load, encode = spans["queue"], spans["load"], spans["encode"]
    for child, parent in ((queue, root), (load, root), (encode, local)):
        assert child.trace_id == parent.context.trace_id.to_bytes(16, "big")
        assert child.parent_span_id == parent.context.span_id.to_bytes(8, "big")
        assert child.span_id not in (b"\0" * 8, child.parent_span_id)
        assert child.kind == ProtoSpan.SPAN_KIND_INTERNAL
        assert child.flags == 0x101  # sampled, parent local
    assert queue.trace_state == "k=v" and encode.trace_state == ""
    assert (queue.start_time_unix_nano, queue.end_time_unix_nano) == (10, 25)
    assert {a.key: a.value.string_value for a in queue.attributes} == {"fnrt.priority": "normal"}
    values = {a.key: a.value for a in load.attributes}
    assert [v.string_value for v in values["fnrt.load.tiers"].array_value.values] == ["l2"]
    assert values["fnrt.load.s"].double_value == 0.5
    assert {a.key: a.value.int_value for a in encode.attributes} == {"fnrt.response.bytes": 4096}
    # the in-memory and console exporters see them as spans
    span = as_span(records[0])  # type: ignore[arg-type]
    assert (span.name, span.parent, span.start_ns, span.end_ns) == ("queue", root.context, 10, 25)
    assert span.context.trace_id == root.context.trace_id and span.context.trace_state == "k=v"
    assert span.kind is SpanKind.INTERNAL and span.attributes == {"fnrt.priority": "normal"}


def test_an_unsampled_parent_makes_no_records() -> None:
    ended: list[object] = []
    tracing = Tracing(Tracer(TraceConfig(sampler="traceidratio", sampler_ratio=0.0), ended.append))
    root = tracing.server_span("POST", "/v1/functions/{name}/invoke", "/x", {})
    assert root is not None and not root.recording
    tracing.after(root, "queue", 1, 2, {})
    tracing.after(None, "queue", 1, 2, {})
    assert ended == []


def test_children_a_span_carries_decode_as_its_own_spans() -> None:
    """A request's queue wait and encoding travel inside its server span's flat tuple
    and come out as spans of their own: its children, with their times and attributes,
    a trace state or not; one made after the span ended is exported alone."""
    ended: list[object] = []
    tracer = Tracer(TraceConfig(), ended.append)
    remote = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "k=v")
    for parent in (remote, None):
        root = tracer.start("POST /v1/functions/{name}/invoke", parent, kind=SpanKind.SERVER)
        root.after("queue", 10, 25, {"fnrt.priority": "normal"})
        root.after("encode", 30, 31, {"fnrt.response.bytes": 4096})
        root.end()
        root.after("late", 40, 41, {})
    assert len(ended) == 4  # each server span with its children, and each late one alone
    request = ExportTraceServiceRequest()
    request.ParseFromString(encode_request(ended, {"service.name": "fnrt-test"}))  # type: ignore[arg-type]
    spans = request.resource_spans[0].scope_spans[0].spans
    roots = [s for s in spans if s.kind == ProtoSpan.SPAN_KIND_SERVER]
    assert len(spans) == 8 and len(roots) == 2
    for root_span in roots:
        children = {s.name: s for s in spans if s.parent_span_id == root_span.span_id}
        assert set(children) == {"queue", "encode", "late"}
        for child in children.values():
            assert child.trace_id == root_span.trace_id
            assert child.trace_state == root_span.trace_state
            assert child.kind == ProtoSpan.SPAN_KIND_INTERNAL and child.flags == 0x101
            assert child.span_id not in (b"\0" * 8, root_span.span_id)
        queue, encode = children["queue"], children["encode"]
        assert (queue.start_time_unix_nano, queue.end_time_unix_nano) == (10, 25)
        assert {a.key: a.value.string_value for a in queue.attributes} == {
            "fnrt.priority": "normal"
        }
        assert {a.key: a.value.int_value for a in encode.attributes} == {
            "fnrt.response.bytes": 4096
        }
    assert {s.trace_state for s in roots} == {"k=v", ""}


def test_a_request_span_decodes_as_the_server_span_it_stands_for() -> None:
    """A request's server span travels as tuples of fields and is encoded straight
    from them (its name, HTTP attributes and what answered, from a cache; its queue
    wait and encoding as children, beside the load it carries), the same as the span
    :func:`span_of_request` makes of it; one with attributes of its own or an error
    takes the general path. Both read back the same with the official schema."""
    ended: list[object] = []
    tracing = Tracing(Tracer(TraceConfig(), ended.append))
    remote = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    path = "/v1/functions/mlp/invoke"
    plain = tracing.server_span("POST", "/v1/functions/{name}/invoke", path, remote)
    failed = tracing.server_span("POST", "/v1/functions/{name}/invoke", path, {"user-agent": "t"})
    assert isinstance(plain, ServerSpan) and isinstance(failed, ServerSpan)
    plain.queued = (10, 25, "normal")
    plain.after("load", 11, 20, {"fnrt.load.tier": "l2"})
    plain.encoded = (30, 31, 4096)
    plain.finish(200, "mlp", "v-1", "l2")
    fail(failed, RuntimeError("boom"))
    failed.finish(500, "mlp", "v-1")
    stated = tracing.server_span(  # a trace state: its children take the general path
        "POST", "/v1/functions/{name}/invoke", path, {**remote, "tracestate": "k=v"}
    )
    assert isinstance(stated, ServerSpan)
    stated.queued = (40, 45, "high")
    stated.encoded = (50, 51, 8)
    stated.finish(200, "mlp", "v-1")
    assert [len(item) for item in ended] == [REQUEST_FIELDS] * 3  # type: ignore[arg-type]
    as_spans = [span_of_request(item) for item in ended]  # type: ignore[arg-type]

    def decoded(items: list[Any]) -> list[ProtoSpan]:
        request = ExportTraceServiceRequest()
        request.ParseFromString(encode_request(items, {"service.name": "fnrt-test"}))
        return list(request.resource_spans[0].scope_spans[0].spans)

    fast, slow = decoded(ended), decoded(as_spans)
    assert len(fast) == len(slow) == 8  # the children ride with their request
    for one, other in zip(fast, slow, strict=True):
        if one.kind == ProtoSpan.SPAN_KIND_INTERNAL:  # a child's id is drawn at each export
            one.span_id = other.span_id = b""
        assert one == other
    served, queue, load, encode, errored = fast[:5]
    assert [(s.name, s.trace_state) for s in fast[5:]] == [
        ("POST /v1/functions/{name}/invoke", "k=v"),
        ("queue", "k=v"),
        ("encode", "k=v"),
    ]
    assert served.name == "POST /v1/functions/{name}/invoke"
    assert served.kind == ProtoSpan.SPAN_KIND_SERVER and served.flags == 0x301  # remote parent
    assert served.parent_span_id.hex() == "00f067aa0ba902b7"
    assert [(c.name, c.start_time_unix_nano, c.end_time_unix_nano) for c in fast[1:4]] == [
        ("queue", 10, 25),
        ("load", 11, 20),
        ("encode", 30, 31),
    ]
    assert {c.parent_span_id for c in (queue, load, encode)} == {served.span_id}
    assert {a.key: a.value.string_value for a in queue.attributes} == {"fnrt.priority": "normal"}
    assert {a.key: a.value.int_value for a in encode.attributes} == {"fnrt.response.bytes": 4096}
    values = {a.key: a.value for a in served.attributes}
    assert values["url.path"].string_value == path
    assert values["http.response.status_code"].int_value == 200
    assert values["fnrt.cold_start"].string_value == "l2"
    assert "user_agent.original" not in values
    values = {a.key: a.value for a in errored.attributes}
    assert values["user_agent.original"].string_value == "t"
    assert values["error.type"].string_value == "RuntimeError"
    assert "fnrt.cold_start" not in values
    assert errored.status.code == Status.STATUS_CODE_ERROR
    assert errored.events[0].name == "exception"
    # the in-memory and console exporters see the same span
    span = as_span(ended[1])  # type: ignore[arg-type]
    assert span.name == "POST /v1/functions/{name}/invoke" and span.kind is SpanKind.SERVER
    assert span.attributes["http.response.status_code"] == 500
    assert span.status is StatusCode.ERROR


def test_values_a_caller_chose_are_encoded_but_not_kept_when_long() -> None:
    """A hostile client can send a new 64 kB user agent with every request: the encoder
    writes it each time but keeps none of it in its caches, so their memory stays
    small whatever the requests (short values are still cached)."""
    ended: list[object] = []
    tracing = Tracing(Tracer(TraceConfig(), ended.append))
    path = "/v1/functions/mlp/invoke"
    for agent in ("a" * 65536, "b" * 65536, "short"):
        span = tracing.server_span(
            "POST", "/v1/functions/{name}/invoke", path, {"user-agent": agent}
        )
        fail(span, RuntimeError("general path too"))
        span.finish(500, "mlp", "v-1")
        plain = tracing.server_span(
            "POST", "/v1/functions/{name}/invoke", path, {"user-agent": agent}
        )
        plain.finish(200, "mlp", "v-1")
    request = ExportTraceServiceRequest()
    request.ParseFromString(encode_request(ended, {"service.name": "fnrt-test"}))  # type: ignore[arg-type]
    agents = [
        a.value.string_value
        for s in request.resource_spans[0].scope_spans[0].spans
        for a in s.attributes
        if a.key == "user_agent.original"
    ]
    assert agents == ["a" * 65536] * 2 + ["b" * 65536] * 2 + ["short"] * 2
    caches = (otlp._kv_cache, otlp._block_cache, otlp._request_blocks, otlp._heads)
    kept = [v for cache in caches for v in cache.values()]  # type: ignore[attr-defined]
    assert kept and max(len(v) for v in kept) <= 1024
    assert any(b"short" in v for v in kept)
