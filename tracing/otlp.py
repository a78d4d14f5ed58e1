"""OTLP's protobuf encoding of spans, written by hand for speed.

``ExportTraceServiceRequest`` bytes (what ``POST /v1/traces`` takes with
``Content-Type: application/x-protobuf``), built from fnrt's span records.
The bytes of a key-value attribute repeat from span to span (routes,
function names, versions), so they are encoded once and reused. Checked
against the ``opentelemetry-proto`` classes in the tests.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any

from fnrt.tracing.recorder import Span, SpanContext, StatusCode

_FIXED64 = struct.Struct("<Q")
_DOUBLE = struct.Struct("<d")
_FIXED32 = struct.Struct("<I")
_CACHE_LIMIT = 8192
_kv_cache: dict[tuple[str, Any], bytes] = {}


def _varint(value: int) -> bytes:
    value &= 0xFFFFFFFFFFFFFFFF  # int64 negatives go as their two's complement
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _any_value(value: Any) -> bytes:
    if isinstance(value, bool):
        return b"\x10" + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, list | tuple):  # array_value { repeated AnyValue values = 1 }
        return _field(5, b"".join(_field(1, _any_value(v)) for v in value))
    return _field(1, str(value).encode())


def key_value(key: str, value: Any) -> bytes:
    """One ``KeyValue`` message (without its enclosing field header)."""
    cacheable = isinstance(value, str | bool) or (isinstance(value, int) and -1 < value < 1024)
    if cacheable:
        cached = _kv_cache.get((key, value))
        if cached is not None:
            return cached
    encoded = _field(1, key.encode()) + _field(2, _any_value(value))
    if cacheable and len(_kv_cache) < _CACHE_LIMIT:
        _kv_cache[(key, value)] = encoded
    return encoded


def _attributes(number: int, attributes: Mapping[str, Any]) -> bytes:
    return b"".join(_field(number, key_value(k, v)) for k, v in attributes.items())


def _trace_id(context: SpanContext) -> bytes:
    return context.trace_id.to_bytes(16, "big")


def _span_id(context: SpanContext) -> bytes:
    return context.span_id.to_bytes(8, "big")


def encode_span(span: Span) -> bytes:
    """One ``Span`` message."""
    context = span.context
    parts = [
        b"\x0a\x10" + _trace_id(context),
        b"\x12\x08" + _span_id(context),
    ]
    if context.trace_state:
        parts.append(_field(3, context.trace_state.encode()))
    if span.parent is not None:
        parts.append(b"\x22\x08" + _span_id(span.parent))
    parts += [
        _field(5, span.name.encode()),
        b"\x30" + _varint(int(span.kind)),
        b"\x39" + _FIXED64.pack(span.start_ns),
        b"\x41" + _FIXED64.pack(span.end_ns),
        _attributes(9, span.attributes),
    ]
    for name, at_ns, attributes in span.events:
        event = b"\x09" + _FIXED64.pack(at_ns) + _field(2, name.encode())
        parts.append(_field(11, event + _attributes(3, attributes)))
    for link in span.links:
        body = b"\x0a\x10" + _trace_id(link) + b"\x12\x08" + _span_id(link)
        parts.append(_field(13, body + b"\x35" + _FIXED32.pack(0x100 | link.flags)))
    if span.status is not StatusCode.UNSET:
        status = b""
        if span.status_message:
            status += _field(2, span.status_message.encode())
        status += b"\x18" + _varint(int(span.status))
        parts.append(_field(15, status))
    # flags: the sampled bit, and whether the parent was remote (0x100 known, 0x200 remote)
    remote = 0x100 | (0x200 if span.parent is not None and span.parent.remote else 0)
    parts.append(b"\x85\x01" + _FIXED32.pack(remote | context.flags))
    return b"".join(parts)


def encode_request(
    spans: Iterable[Span], resource: Mapping[str, Any], scope: str = "fnrt"
) -> bytes:
    """An ``ExportTraceServiceRequest`` holding ``spans`` under one resource and scope."""
    body = b"".join(_field(2, encode_span(span)) for span in spans)
    scope_spans = _field(1, _field(1, scope.encode())) + body
    resource_spans = _field(1, _attributes(1, resource)) + _field(2, scope_spans)
    return _field(1, resource_spans)
