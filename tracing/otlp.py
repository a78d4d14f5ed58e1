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

from fnrt.tracing.recorder import (
    RECORD_FIELDS,
    REQUEST_FIELDS,
    SPAN_FIELDS,
    Flat,
    StatusCode,
    http_attributes,
    request_children,
    span_of_request,
)

_FIXED64 = struct.Struct("<Q")
_DOUBLE = struct.Struct("<d")
_FIXED32 = struct.Struct("<I")
_CACHE_LIMIT = 8192
#: The longest encoding a cache keeps: a value a caller chose (a user agent of 64 kB,
#: say) is encoded each time rather than kept, so each cache stays under 8192 entries
#: of a few kB however hostile the requests.
_CACHED_BYTES = 1024
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
    if len(_kv_cache) < _CACHE_LIMIT and len(encoded) <= _CACHED_BYTES:
        _kv_cache[(number, key, kind, value)] = encoded
    return encoded


def _attributes(number: int, attributes: Mapping[str, Any]) -> bytes:
    return b"".join([_attribute(number, k, v) for k, v in attributes.items()])


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
#: Field 13, a link: its header (33 bytes follow), trace id and span id; then its flags
#: (fixed32, little-endian: known local, and sampled or not).
_LINK = struct.Struct(">4sQQ2sQ").pack
_LINK_FLAGS = {False: b"\x35" + _I(0x100), True: b"\x35" + _I(0x101)}
#: The constant bytes of a span's shape (its name and kind), encoded once.
_heads: dict[tuple[str, int], bytes] = {}


def _head(name: str, kind: int) -> bytes:
    head = _heads.get((name, kind))
    if head is None:
        head = _field(5, name.encode()) + _KIND[kind]
        if len(_heads) < _CACHE_LIMIT and len(head) <= _CACHED_BYTES:
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
        if len(_block_cache) < _CACHE_LIMIT and len(block) <= _CACHED_BYTES:
            _block_cache[items] = block
    return block


def _plain_value(value: Any) -> Any:
    """``value`` as the builtin the encoder would read it as (an enum as its value, any
    other object as its text)."""
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, list | tuple):
        return [_plain_value(v) for v in value]
    return str(value)


def _plain_attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {str(k): _plain_value(v) for k, v in attributes.items()}


def plain(flat: Flat) -> Flat:
    """``flat`` with every name and attribute a builtin, encoded as before (for ``marshal``,
    which takes no subclasses: a str enum, an int enum)."""
    if len(flat) == RECORD_FIELDS:
        return (str(flat[0]), *flat[1:3], str(flat[3]), *flat[4:6], _plain_attributes(flat[6]))
    if len(flat) == REQUEST_FIELDS:
        flat = span_of_request(flat)
    events = [(str(n), int(t), _plain_attributes(a)) for n, t, a in flat[9]]
    children = [(str(n), s, e, _plain_attributes(a)) for n, s, e, a in flat[13]]
    return (
        str(flat[0]),
        *flat[1:4],
        str(flat[4]),
        *flat[5:8],
        _plain_attributes(flat[8]),
        events,
        *flat[10:12],
        str(flat[12]),
        children,
    )


def _encode_span(flat: Flat) -> bytes:
    """One ``Span`` message from a flat span."""
    (
        name,
        kind,
        trace_id,
        span_id,
        trace_state,
        parent,
        start_ns,
        end_ns,
        attributes,
        events,
        links,
        status,
        message,
        _,
    ) = flat
    parts = [
        _ids(trace_id, span_id, trace_state, None if parent is None else parent[1]),
        _head(name, kind),
        _TIMES(b"\x39", start_ns, b"\x41", end_ns),
        _span_attributes(attributes),
    ]
    for event_name, at_ns, event_attributes in events:
        event = b"\x09" + _Q(at_ns) + _field(2, event_name.encode())
        parts.append(_field(11, event + _attributes(3, event_attributes)))
    for link_trace_id, link_span_id, link_sampled, _, _ in links:
        parts.append(
            _LINK(
                b"\x6a\x21\x0a\x10",
                link_trace_id >> 64,
                link_trace_id & _LOW64,
                b"\x12\x08",
                link_span_id,
            )
            + _LINK_FLAGS[link_sampled]
        )
    if status != StatusCode.UNSET:
        encoded = _field(2, message.encode()) if message else b""
        parts.append(_field(15, encoded + b"\x18" + _varint(status)))
    parts.append(_FLAGS[1, parent is not None and parent[4]])  # exported: sampled
    return b"".join(parts)


def _encode_record(flat: Flat) -> bytes:
    """One ``Span`` message from a flat record (its id drawn here): an internal,
    sampled child of its request's span."""
    name, trace_id, parent_id, trace_state, start_ns, end_ns, attributes = flat
    return b"".join(
        (
            _ids(trace_id, random.getrandbits(64) or 1, trace_state, parent_id),
            _head(name, 1),
            _TIMES(b"\x39", start_ns, b"\x41", end_ns),
            _span_attributes(attributes),
            _FLAGS[1, False],
        )
    )


#: A request's name, kind and HTTP attributes by its (http, response): they repeat from
#: request to request.
_request_blocks: dict[tuple[Any, Any], bytes] = {}


def _encode_request(flat: Flat) -> bytes:
    """One ``Span`` message from a request (see :data:`fnrt.tracing.recorder.Flat`)."""
    if flat[10] is not None:  # attributes set on it, events, an error: as any span
        return _encode_span(span_of_request(flat))
    trace_id, span_id, trace_state, parent, start_ns, end_ns, http, response = flat[:8]
    key = (http, response)
    block = _request_blocks.get(key)
    if block is None:
        block = _head(f"{http[0]} {http[1]}", 2) + _attributes(9, http_attributes(http, response))
        if len(_request_blocks) < _CACHE_LIMIT and len(block) <= _CACHED_BYTES:
            _request_blocks[key] = block
    return b"".join(
        (
            _ids(trace_id, span_id, trace_state, None if parent is None else parent[1]),
            block,
            _TIMES(b"\x39", start_ns, b"\x41", end_ns),
            _FLAGS[1, parent is not None and parent[4]],
        )
    )


_CHILD_FLAGS = _FLAGS[1, False]


def _add_child(
    parts: list[bytes],
    trace: tuple[int, int],
    parent_id: int,
    head: bytes,
    start_ns: int,
    end_ns: int,
    attributes: bytes,
) -> None:
    """Append one child of a span without a trace state to ``parts``, a framed ``Span``
    message (its id drawn here): ``trace`` is the trace id's high and low halves,
    ``head`` its name and kind (:func:`_head`), ``attributes`` its encoded block."""
    high, low = trace
    encoded = b"".join(
        (
            _IDS(
                b"\x0a\x10",
                high,
                low,
                b"\x12\x08",
                random.getrandbits(64) or 1,
                b"\x22\x08",
                parent_id,
            ),
            head,
            _TIMES(b"\x39", start_ns, b"\x41", end_ns),
            attributes,
            _CHILD_FLAGS,
        )
    )
    parts += (b"\x12", _varint(len(encoded)), encoded)


def _add_children(
    parts: list[bytes],
    trace_id: int,
    span_id: int,
    trace_state: str,
    children: Iterable[tuple[str, int, int, Mapping[str, Any]]],
) -> None:
    """Append the children a span carries to ``parts``, each a framed ``Span`` message:
    :func:`_encode_record`'s bytes, with what they share with their parent packed once."""
    if trace_state:
        for name, start_ns, end_ns, attributes in children:
            encoded = _encode_record(
                (name, trace_id, span_id, trace_state, start_ns, end_ns, attributes)
            )
            parts += (b"\x12", _varint(len(encoded)), encoded)
        return
    trace = (trace_id >> 64, trace_id & _LOW64)
    for name, start_ns, end_ns, attributes in children:
        head = _heads.get((name, 1)) or _head(name, 1)
        _add_child(parts, trace, span_id, head, start_ns, end_ns, _span_attributes(attributes))


_QUEUE_HEAD = _head("queue", 1)
_ENCODE_HEAD = _head("encode", 1)


def _add_request_children(parts: list[bytes], request: Flat) -> None:
    """Append a request's children to ``parts`` (see :func:`_add_children`): its queue
    wait and its answer's encoding encoded straight from their tuples of times
    (:data:`fnrt.tracing.recorder.Queued`, :data:`~fnrt.tracing.recorder.Encoded`),
    the same bytes :func:`request_children` and :func:`_add_children` would make,
    without their tuples and attribute dictionaries; what it carries (a load) as
    any span's children."""
    trace_id, span_id, trace_state = request[0], request[1], request[2]
    queued, encoded, carried = request[8], request[9], request[11]
    if trace_state:  # rare: the general path writes field 3
        _add_children(parts, trace_id, span_id, trace_state, request_children(request))
        return
    trace = (trace_id >> 64, trace_id & _LOW64)
    if queued is not None:
        enqueued_ns, started_ns, priority = queued
        attribute = _attribute(9, "fnrt.priority", priority)
        _add_child(parts, trace, span_id, _QUEUE_HEAD, enqueued_ns, started_ns, attribute)
    if carried:
        _add_children(parts, trace_id, span_id, "", carried)
    if encoded is not None:
        started_ns, ended_ns, size = encoded
        attribute = _attribute(9, "fnrt.response.bytes", size)
        _add_child(parts, trace, span_id, _ENCODE_HEAD, started_ns, ended_ns, attribute)


#: Spans encoded between two offers of the GIL (about 0.2 ms of work): see encode_request.
YIELD_EVERY = 128


def encode_request(
    spans: Iterable[Flat],
    resource: Mapping[str, Any],
    scope: str = "fnrt",
    yield_every: int = YIELD_EVERY,
) -> bytes:
    """An ``ExportTraceServiceRequest`` holding ``spans`` and records (flat, as a tracer
    hands them to its sink) under one resource and scope.

    It offers the GIL back every ``yield_every`` spans: where it runs in a
    process's export thread (a client's), the main thread, wanting the GIL,
    would otherwise wait out the interpreter's switch interval (5 ms) while a
    batch of thousands is encoded. The shipper, with no other thread to wait,
    passes 0: never (each offer is a system call, and on a busy machine often
    a wait for the CPU)."""
    parts: list[bytes] = []
    left = yield_every or -1
    for span in spans:
        size = len(span)
        if size == REQUEST_FIELDS:
            encoded = _encode_request(span)
            parts += (b"\x12", _varint(len(encoded)), encoded)  # field 2, length-delimited
            if span[8] is not None or span[9] is not None or span[11]:
                _add_request_children(parts, span)
        elif size == SPAN_FIELDS:
            encoded = _encode_span(span)
            parts += (b"\x12", _varint(len(encoded)), encoded)
            if span[13]:  # the children it carries, as spans of their own
                _add_children(parts, span[2], span[3], span[4], span[13])
        else:
            encoded = _encode_record(span)
            parts += (b"\x12", _varint(len(encoded)), encoded)
        left -= 1
        if not left:
            time.sleep(0)
            left = yield_every
    scope_spans = _field(1, _field(1, scope.encode())) + b"".join(parts)
    resource_spans = _field(1, _attributes(1, resource)) + _field(2, scope_spans)
    return _field(1, resource_spans)
