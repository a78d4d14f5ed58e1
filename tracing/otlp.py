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
_kv_cache: dict[tuple[int, str, type, Any], bytes] = {}
_CACHED_TYPES = (str, bool, int)


def _encode_varint(value: int) -> bytes:
    value &= 0xFFFFFFFFFFFFFFFF  # int64 negatives go as their two's complement
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL = [_encode_varint(i) for i in range(1 << 14)]  # every length and tag here


def _varint(value: int) -> bytes:
    return _SMALL[value] if 0 <= value < 16384 else _encode_varint(value)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _SMALL[number << 3 | 2] + _varint(len(payload)) + payload


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
    return _field(1, key.encode()) + _field(2, _any_value(value))


def _attribute(number: int, key: str, value: Any) -> bytes:
    """A ``KeyValue`` as field ``number``; repeated strings and small ints come from a cache."""
    kind = type(value)
    if kind not in _CACHED_TYPES or (kind is int and not -1 < value < 1024):
        return _field(number, key_value(key, value))  # sizes, timings: not worth a slot
    cached = _kv_cache.get((number, key, kind, value))  # the type: 1 == 1.0 == True as keys
    if cached is not None:
        return cached
    encoded = _field(number, key_value(key, value))
    if len(_kv_cache) < _CACHE_LIMIT:
        _kv_cache[(number, key, kind, value)] = encoded
    return encoded


def _attributes(number: int, attributes: Mapping[str, Any]) -> bytes:
    return b"".join([_attribute(number, k, v) for k, v in attributes.items()])


def _trace_id(context: SpanContext) -> bytes:
    return context.trace_id.to_bytes(16, "big")


def _span_id(context: SpanContext) -> bytes:
    return context.span_id.to_bytes(8, "big")


_name_cache: dict[str, bytes] = {}
_KIND = [b"\x30" + bytes([k]) for k in range(6)]
_Q = _FIXED64.pack
_I = _FIXED32.pack


def encode_span(span: Span) -> bytes:
    """One ``Span`` message."""
    context = span.context
    trace_id = context.trace_id.to_bytes(16, "big")
    parts = [b"\x0a\x10", trace_id, b"\x12\x08", context.span_id.to_bytes(8, "big")]
    if context.trace_state:
        parts.append(_field(3, context.trace_state.encode()))
    parent = span.parent
    if parent is not None:
        parts += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
    name = _name_cache.get(span.name)
    if name is None:
        name = _field(5, span.name.encode())
        if len(_name_cache) < _CACHE_LIMIT:
            _name_cache[span.name] = name
    parts += (name, _KIND[span.kind], b"\x39", _Q(span.start_ns), b"\x41", _Q(span.end_ns))
    cache = _kv_cache
    for key, value in span.attributes.items():
        try:
            cached = cache.get((9, key, type(value), value))
        except TypeError:  # an unhashable value (a list): encoded each time
            cached = None
        parts.append(cached if cached is not None else _attribute(9, key, value))
    for event_name, at_ns, attributes in span.events:
        event = b"\x09" + _Q(at_ns) + _field(2, event_name.encode())
        parts.append(_field(11, event + _attributes(3, attributes)))
    for link in span.links:
        body = b"\x0a\x10" + _trace_id(link) + b"\x12\x08" + _span_id(link)
        parts.append(_field(13, body + b"\x35" + _I(0x100 | link.flags)))
    if span.status is not StatusCode.UNSET:
        status = b""
        if span.status_message:
            status += _field(2, span.status_message.encode())
        status += b"\x18" + _varint(int(span.status))
        parts.append(_field(15, status))
    # flags: the sampled bit, and whether the parent was remote (0x100 known, 0x200 remote)
    remote = 0x300 if parent is not None and parent.remote else 0x100
    parts += (b"\x85\x01", _I(remote | context.flags))
    return b"".join(parts)


def encode_request(
    spans: Iterable[Span], resource: Mapping[str, Any], scope: str = "fnrt"
) -> bytes:
    """An ``ExportTraceServiceRequest`` holding ``spans`` under one resource and scope."""
    body = b"".join(_field(2, encode_span(span)) for span in spans)
    scope_spans = _field(1, _field(1, scope.encode())) + body
    resource_spans = _field(1, _attributes(1, resource)) + _field(2, scope_spans)
    return _field(1, resource_spans)
