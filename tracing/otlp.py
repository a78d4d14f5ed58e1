"""OTLP's protobuf encoding of spans, written by hand for speed.

``ExportTraceServiceRequest`` bytes (what ``POST /v1/traces`` takes with
``Content-Type: application/x-protobuf``), built from fnrt's span records.
The bytes of a key-value attribute repeat from span to span (routes,
function names, versions), so they are encoded once and reused. Checked
against the ``opentelemetry-proto`` classes in the tests.
"""

from __future__ import annotations

import random
import struct
import time
from collections.abc import Iterable, Mapping
from typing import Any

from fnrt.tracing.recorder import Record, Span, SpanContext, StatusCode

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


_KIND = [b"\x30" + bytes([k]) for k in range(6)]
_Q = _FIXED64.pack
_I = _FIXED32.pack
_LOW64 = 0xFFFFFFFFFFFFFFFF
#: Fields 1, 2 and 4: trace id, span id and parent span id (big-endian, as bytes are).
_IDS = struct.Struct(">2sQQ2sQ2sQ").pack
_IDS_ROOT = struct.Struct(">2sQQ2sQ").pack  # no parent
#: Fields 7 and 8: start and end (fixed64, little-endian).
_TIMES = struct.Struct("<cQcQ").pack
#: Field 16, flags: the sampled bit, and whether the parent is remote (0x100 known,
#: 0x200 remote), by (sampled, remote parent).
_FLAGS = {
    (sampled, remote): b"\x85\x01" + _I((0x300 if remote else 0x100) | sampled)
    for sampled in (0, 1)
    for remote in (False, True)
}
#: The constant bytes of a span's shape (its name and kind), encoded once.
_heads: dict[tuple[str, int], bytes] = {}


def _head(name: str, kind: int) -> bytes:
    head = _heads.get((name, kind))
    if head is None:
        head = _field(5, name.encode()) + _KIND[kind]
        if len(_heads) < _CACHE_LIMIT:
            _heads[(name, kind)] = head
    return head


def _ids(trace_id: int, span_id: int, trace_state: str, parent_id: int | None) -> bytes:
    """Fields 1 to 4: a span's identity and its parent's."""
    if trace_state:  # rare: field 3 sits between the span's id and its parent's
        out = b"\x0a\x10" + trace_id.to_bytes(16, "big") + b"\x12\x08"
        out += span_id.to_bytes(8, "big") + _field(3, trace_state.encode())
        return out if parent_id is None else out + b"\x22\x08" + parent_id.to_bytes(8, "big")
    high, low = trace_id >> 64, trace_id & _LOW64
    if parent_id is None:
        return _IDS_ROOT(b"\x0a\x10", high, low, b"\x12\x08", span_id)
    return _IDS(b"\x0a\x10", high, low, b"\x12\x08", span_id, b"\x22\x08", parent_id)


#: Whole attribute blocks by their items: a request's span repeats its route, function,
#: version and status from request to request.
_block_cache: dict[tuple[tuple[str, Any], ...], bytes] = {}


def _span_attributes(attributes: Mapping[str, Any]) -> bytes:
    """A span's attributes as fields 9, the whole block from a cache when it repeats."""
    items = tuple(attributes.items())
    try:
        block = _block_cache.get(items)
    except TypeError:  # an unhashable value (a list): encoded each time
        return _attributes(9, attributes)
    if block is None:
        block = _attributes(9, attributes)
        if len(_block_cache) < _CACHE_LIMIT:
            _block_cache[items] = block
    return block


def encode_span(span: Span) -> bytes:
    """One ``Span`` message."""
    context = span.context
    parent = span.parent
    parts = [
        _ids(
            context.trace_id,
            context.span_id,
            context.trace_state,
            None if parent is None else parent.span_id,
        ),
        _head(span.name, span.kind),
        _TIMES(b"\x39", span.start_ns, b"\x41", span.end_ns),
        _span_attributes(span.attributes),
    ]
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
    parts.append(_FLAGS[context.flags, parent is not None and parent.remote])
    return b"".join(parts)


def encode_record(record: Record) -> bytes:
    """One ``Span`` message from a span made after the fact (its id drawn here): an
    internal, sampled child of its request's span."""
    parent = record.parent
    return b"".join(
        (
            _ids(parent.trace_id, random.getrandbits(64) or 1, parent.trace_state, parent.span_id),
            _head(record.name, 1),
            _TIMES(b"\x39", record.start_ns, b"\x41", record.end_ns),
            _span_attributes(record.attributes),
            _FLAGS[1, False],
        )
    )


#: Spans encoded between two offers of the GIL (about 0.2 ms of work): see encode_request.
YIELD_EVERY = 128


def encode_request(
    spans: Iterable[Span | Record], resource: Mapping[str, Any], scope: str = "fnrt"
) -> bytes:
    """An ``ExportTraceServiceRequest`` holding ``spans`` (and records) under one
    resource and scope.

    Called from the export thread, it offers the GIL back every ``YIELD_EVERY``
    spans: otherwise the event loop's thread, wanting it, would wait out the
    interpreter's switch interval (5 ms) while a batch of thousands is encoded,
    and every request in flight would wait with it."""
    parts: list[bytes] = []
    left = YIELD_EVERY
    for span in spans:
        encoded = encode_span(span) if type(span) is Span else encode_record(span)  # type: ignore[arg-type]
        parts += (b"\x12", _varint(len(encoded)), encoded)  # field 2, length-delimited
        left -= 1
        if not left:
            time.sleep(0)
            left = YIELD_EVERY
    scope_spans = _field(1, _field(1, scope.encode())) + b"".join(parts)
    resource_spans = _field(1, _attributes(1, resource)) + _field(2, scope_spans)
    return _field(1, resource_spans)
