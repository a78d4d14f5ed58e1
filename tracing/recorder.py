"""A lean span recorder: OpenTelemetry's data model at a few microseconds a span.

The OpenTelemetry Python SDK spends ~55 µs making a span and ~47 µs encoding
it; an invoke has four, which halved fnrt's throughput at 100% sampling.
Here a span is a slotted record, ids come from ``random.getrandbits``,
sampling follows OpenTelemetry's rules (trace-id ratio, parent-based), and
ended spans are handed to an exporter (:mod:`fnrt.tracing.export`) that
encodes them as OTLP off the request path. W3C ``traceparent`` /
``tracestate`` are parsed and written here.
"""

from __future__ import annotations

import random
import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import IntEnum
from itertools import repeat
from operator import itemgetter, setitem
from time import time_ns
from typing import Any, NamedTuple

from fnrt.tracing.config import TraceConfig


class SpanKind(IntEnum):
    """OTLP's span kinds (the numbers are the wire values)."""

    INTERNAL = 1
    SERVER = 2
    CLIENT = 3
    PRODUCER = 4
    CONSUMER = 5


class StatusCode(IntEnum):
    UNSET = 0
    OK = 1
    ERROR = 2


class SpanContext(NamedTuple):
    """The identity of a span as propagated: ids, sampled flag, vendor state."""

    trace_id: int
    span_id: int
    sampled: bool
    trace_state: str = ""
    remote: bool = False

    @property
    def flags(self) -> int:
        return 1 if self.sampled else 0


class BaseSpan:
    """What every span has: its identity, times, and the children made after the fact
    that it carries; ``end`` hands it to the tracer's sink, flat, when it is sampled."""

    __slots__ = (
        "_sink",
        "children",
        "context",
        "end_ns",
        "parent",
        "recording",
        "start_ns",
    )

    context: SpanContext
    parent: SpanContext | None
    start_ns: int
    end_ns: int
    #: Spans made after the fact under this one, (name, start ns, end ns, attributes),
    #: exported with it: see :meth:`after`. A tuple, not a list: an ended span's flat
    #: tuple then holds nothing the garbage collector must keep tracking (it stops
    #: tracking a tuple of untracked things), though it waits a while for export.
    children: tuple[tuple[str, int, int, Mapping[str, Any]], ...]
    recording: bool  # sampled: it goes to the sink when it ends
    _sink: Callable[[Flat], None] | None

    def after(self, name: str, start_ns: int, end_ns: int, attributes: Mapping[str, Any]) -> None:
        """A child that began and ended already (a load, a generation): carried by this
        span, and exported with it as a span of its own (its id drawn then), so the
        request path pays two small tuples. Once this span has ended, the child is
        exported alone. Only for a recording span."""
        if not self.end_ns:
            self.children += ((name, start_ns, end_ns, attributes),)
        elif self._sink is not None:
            self._sink(record_of(name, self.context, start_ns, end_ns, attributes))

    def set_attribute(self, key: str, value: Any) -> None:
        raise NotImplementedError

    def record_exception(self, error: BaseException) -> None:
        raise NotImplementedError

    def set_status(self, code: StatusCode, message: str = "") -> None:
        raise NotImplementedError

    def end(self, end_ns: int | None = None) -> None:
        if self.end_ns:
            return  # ended already
        self.end_ns = end_ns or time_ns()
        if self._sink is not None:
            self._sink(self.flat())

    def flat(self) -> Flat:
        raise NotImplementedError


def exception_event(error: BaseException) -> tuple[str, int, dict[str, Any]]:
    """The ``exception`` event recording ``error``, now."""
    return (
        "exception",
        time_ns(),
        {"exception.type": type(error).__name__, "exception.message": str(error)},
    )


class Span(BaseSpan):
    """One span."""

    __slots__ = (
        "_traceparent",
        "attributes",
        "events",
        "kind",
        "links",
        "name",
        "status",
        "status_message",
    )

    def __init__(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        start_ns: int,
        attributes: dict[str, Any],
        links: Sequence[SpanContext],
        sink: Callable[[Flat], None] | None,
    ) -> None:
        self.name = name
        self.context = context
        self.parent = parent
        self.kind = kind
        self.start_ns = start_ns
        self.end_ns = 0
        self.attributes = attributes
        self.links = links
        #: (name, ns, attributes); a span seldom has any
        self.events: Sequence[tuple[str, int, dict[str, Any]]] = ()
        self.children = ()
        self.status = StatusCode.UNSET
        self.status_message = ""
        self._sink = sink
        self.recording = sink is not None
        self._traceparent = ""

    @property
    def traceparent(self) -> str:
        """The W3C ``traceparent`` naming this span (formatted once)."""
        if not self._traceparent:
            self._traceparent = format_traceparent(self.context)
        return self._traceparent

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def record_exception(self, error: BaseException) -> None:
        self.events = (*self.events, exception_event(error))

    def set_status(self, code: StatusCode, message: str = "") -> None:
        self.status, self.status_message = code, message

    def flat(self) -> Flat:
        """This span as a tuple of builtins (``SPAN_FIELDS`` of them; see :data:`Flat`)."""
        context, parent, links = self.context, self.parent, self.links
        return (
            self.name,
            self.kind + 0,  # the plain int (marshal takes no IntEnum)
            context.trace_id,
            context.span_id,
            context.trace_state,
            parent if parent is None else tuple(parent),
            self.start_ns,
            self.end_ns,
            self.attributes,
            self.events,
            tuple(map(tuple, links)) if links else (),  # plain tuples, each
            self.status + 0,
            self.status_message,
            self.children,
        )

    def __repr__(self) -> str:
        return f"Span({self.name!r}, trace={self.context.trace_id:032x})"


#: A request's HTTP side as its server span keeps it: method, route, path, user agent.
Http = tuple[str, str, str, str]
#: What answered: status code, function, version, the cold start's tier (None: warm).
Response = tuple[int, str, str, "str | None"]
#: A request's wait in its queue: enqueued ns, started ns, its priority's name.
Queued = tuple[int, int, str]
#: The encoding of a request's answer: start ns, end ns, the answer's bytes.
Encoded = tuple[int, int, int]


class _Rare:
    """What a server span seldom has (an error's, a split's): set on the first need."""

    __slots__ = ("attributes", "events", "status", "status_message")

    def __init__(self) -> None:
        self.attributes: dict[str, Any] = {}
        self.events: list[tuple[str, int, dict[str, Any]]] = []
        self.status = StatusCode.UNSET
        self.status_message = ""

    def flat(self) -> tuple[dict[str, Any], tuple[tuple[str, int, dict[str, Any]], ...], int, str]:
        return self.attributes, tuple(self.events), self.status + 0, self.status_message


class ServerSpan(list[Any]):
    """The span of one request on the data path, kept lean, as every request makes one.

    It is a list of fields rather than an object of attributes: its first
    ``REQUEST_FIELDS`` are the request it ends as (see :data:`Flat`), in that
    order, so it is made with no ``__init__`` frame (the list is built in C) and
    ended as one ``itemgetter`` of its head; then the sink it ends into and what
    it seldom has (attributes set on it, events, a status: one object made on
    the first need). What the request path reads while it runs is in three
    slots: its context, its ``traceparent`` (formatted when it starts: the answer
    and the request log carry it) and whether it is recorded. Its HTTP
    attributes and what answered are two tuples of fields (:meth:`finish`), its
    queue wait and its answer's encoding two tuples of times (:attr:`queued`,
    :attr:`encoded`) rather than children; it becomes an ordinary span with its
    children only when it is exported (:func:`span_of_request`). Made by
    :meth:`Tracer.start_server`."""

    __slots__ = ("context", "recording", "traceparent")

    context: SpanContext
    traceparent: str  # the W3C header naming it
    recording: bool  # sampled: it goes to its sink when it ends

    @property
    def parent(self) -> SpanContext | None:
        parent = self[3]
        return None if parent is None else SpanContext(*parent)

    @property
    def start_ns(self) -> int:
        start_ns: int = self[4]
        return start_ns

    @property
    def end_ns(self) -> int:
        end_ns: int = self[5]
        return end_ns

    @property
    def http(self) -> Http:
        http: Http = self[6]
        return http

    @property
    def response(self) -> Response | None:
        response: Response | None = self[7]
        return response

    @property
    def queued(self) -> Queued | None:
        queued: Queued | None = self[8]
        return queued

    @queued.setter
    def queued(self, value: Queued | None) -> None:
        self[8] = value

    @property
    def encoded(self) -> Encoded | None:
        encoded: Encoded | None = self[9]
        return encoded

    @encoded.setter
    def encoded(self, value: Encoded | None) -> None:
        self[9] = value

    @property
    def children(self) -> tuple[tuple[str, int, int, Mapping[str, Any]], ...]:
        children: tuple[tuple[str, int, int, Mapping[str, Any]], ...] = self[11]
        return children

    @property
    def name(self) -> str:
        http = self[6]
        return f"{http[0]} {http[1]}"

    def after(self, name: str, start_ns: int, end_ns: int, attributes: Mapping[str, Any]) -> None:
        """A child that began and ended already (see :meth:`BaseSpan.after`)."""
        if not self[5]:
            self[11] += ((name, start_ns, end_ns, attributes),)
        elif self[_S_SINK] is not None:
            self[_S_SINK](record_of(name, self.context, start_ns, end_ns, attributes))

    def _more(self) -> _Rare:
        rare: _Rare | None = self[_S_RARE]
        if rare is None:
            rare = self[_S_RARE] = _Rare()
        return rare

    def set_attribute(self, key: str, value: Any) -> None:
        self._more().attributes[key] = value

    def record_exception(self, error: BaseException) -> None:
        self._more().events.append(exception_event(error))

    def set_status(self, code: StatusCode, message: str = "") -> None:
        rare = self._more()
        rare.status, rare.status_message = code, message

    def finish(
        self, status_code: int, function: str, version: str, cold: str | None = None
    ) -> None:
        """Set what answered (a 5xx marks the span an error) and end it (once: a span
        ended already keeps what it had), into its sink when it is recorded."""
        request = self.ended(status_code, function, version, cold)
        if request is not None:
            self[_S_SINK](request)

    def ended(
        self, status_code: int, function: str, version: str, cold: str | None = None
    ) -> Flat | None:
        """:meth:`finish` without the sink: the request to export (see :data:`Flat`),
        or None when it is not recorded or ended already. The data path hands a
        turn's requests to :meth:`Tracer.export` at once (``Telemetry.flush``)."""
        if self[5]:
            return None
        self[7] = (status_code, function, version, cold)
        if status_code >= 500:
            self._more().status = StatusCode.ERROR
        self[5] = time_ns()
        if self[_S_SINK] is None:
            return None
        if self[_S_RARE] is not None:
            self[10] = self[_S_RARE].flat()
        request: Flat = _REQUEST(self)
        return request

    def end(self, end_ns: int | None = None) -> None:
        """End it with no answer (once)."""
        if self[5]:
            return
        self[5] = end_ns or time_ns()
        if self[_S_SINK] is not None:
            self[_S_SINK](self.flat())

    def flat(self) -> Flat:
        """This span as a request (``REQUEST_FIELDS`` builtins; see :data:`Flat`)."""
        rare: _Rare | None = self[_S_RARE]
        if rare is not None:
            self[10] = rare.flat()
        flat: Flat = _REQUEST(self)
        return flat

    def __repr__(self) -> str:
        return f"ServerSpan({self.name!r}, trace={self[0]:032x})"


# A ServerSpan's fields past the request it ends as (see its docstring)
_S_SINK, _S_RARE = 12, 13
#: A ServerSpan's head, the request it ends as: one C call
_REQUEST = itemgetter(*range(12))
#: Where a :class:`ServerSpan` keeps its end time (0 while it runs): the data path ends
#: a request's span by setting it, and :func:`answered` makes the turn's requests.
END_NS = 5
_RARE_OF = itemgetter(_S_RARE)
_STATUS_OF = itemgetter(0)


def answered(spans: Sequence[ServerSpan], responses: Sequence[Response]) -> list[Flat]:
    """The requests that recorded ``spans`` end as (see :data:`Flat`), each answered as
    its item of ``responses`` says: what :meth:`ServerSpan.ended` makes of each, for a
    turn's requests at once, with no Python frame a request unless one failed (5xx) or
    has what a span seldom has. Each span's end time is set already (at ``END_NS``,
    when its answer was sent: see ``fnrt.tracing.telemetry.Telemetry.request``)."""
    if len(spans) <= 2:  # one connection or two: a plain loop costs them less than the maps
        requests = []
        for span, response in zip(spans, responses, strict=True):
            span[7] = response
            if response[0] >= 500 or span[_S_RARE] is not None:
                _rarely(span, response[0])
            requests.append(_REQUEST(span))
        return requests
    deque(map(setitem, spans, repeat(7), responses), maxlen=0)
    if max(map(_STATUS_OF, responses)) >= 500 or any(map(_RARE_OF, spans)):
        for span, (status_code, *_) in zip(spans, responses, strict=True):
            _rarely(span, status_code)
    return list(map(_REQUEST, spans))


def _rarely(span: ServerSpan, status_code: int) -> None:
    """What :meth:`ServerSpan.ended` does for a 5xx (an error) and a span's rare part
    (made flat into its head)."""
    if status_code >= 500:
        span._more().status = StatusCode.ERROR
    rare: _Rare | None = span[_S_RARE]
    if rare is not None:
        span[10] = rare.flat()


def set_queued(spans: Iterable[ServerSpan], queued: Iterable[Queued]) -> None:
    """Set each span's :attr:`ServerSpan.queued` from ``queued``, in order: a batch's
    queue waits at once, with no Python frame a request."""
    deque(map(setitem, spans, repeat(8), queued), maxlen=0)


def server_span(
    context: SpanContext,
    parent: SpanContext | None,
    traceparent: str,
    http: Http,
    start_ns: int,
    sink: Callable[[Flat], None] | None,
) -> ServerSpan:
    """A :class:`ServerSpan` from its parts (the tracer's common case builds the list
    itself)."""
    span = ServerSpan(
        (
            context.trace_id,
            context.span_id,
            context.trace_state,
            None if parent is None else tuple(parent),
            start_ns,
            0,  # end ns
            http,
            None,  # response
            None,  # queued
            None,  # encoded
            None,  # the rare part, flat
            (),  # children
            sink,
            None,  # the rare part
        )
    )
    span.context, span.traceparent, span.recording = context, traceparent, sink is not None
    return span


#: What a tracer hands its sink: an ended span, or a span made after the fact (a
#: record), as a tuple of builtins, so that the export thread does no more than
#: ``marshal`` a batch of them for the shipper process (:mod:`fnrt.tracing.shipper`),
#: and nothing of the request's objects is touched again once it is answered.
#:
#: A span: (name, kind, trace id, span id, trace state, parent context as a plain
#: 5-tuple or None, start ns, end ns, attributes, events as (name, ns, attributes),
#: links as plain 5-tuples, status code, status message, children as (name, start
#: ns, end ns, attributes): see :meth:`Span.after`); ``SPAN_FIELDS`` of them.
#:
#: A record (a request's queue wait, its load, the encoding of its answer: known
#: whole when made, and nothing refers to its id): (name, trace id, parent span id,
#: trace state, start ns, end ns, attributes); ``RECORD_FIELDS`` of them. It is an
#: internal, sampled child of a local span; its own id is drawn when it is exported.
#:
#: A request (a :class:`ServerSpan`): (trace id, span id, trace state, parent
#: context as a plain 5-tuple or None, start ns, end ns, its :data:`Http`, its
#: :data:`Response` or None, its :data:`Queued` or None, its :data:`Encoded` or
#: None, what it seldom has or None: (attributes set on it, events, status code,
#: status message), children); ``REQUEST_FIELDS`` of them.
#: :func:`span_of_request` makes it a span, and its queue wait and encoding
#: children of it.
Flat = tuple[Any, ...]
SPAN_FIELDS = 14
RECORD_FIELDS = 7
REQUEST_FIELDS = 12


def http_attributes(http: Http, response: Response | None) -> dict[str, Any]:
    """A server span's attributes (HTTP's semantic conventions, then fnrt's) from what
    its :class:`ServerSpan` kept."""
    method, route, path, agent = http
    attributes: dict[str, Any] = {
        "http.request.method": method,
        "http.route": route,
        "url.path": path,
        "url.scheme": "http",
    }
    if agent:
        attributes["user_agent.original"] = agent
    if response is not None:
        status_code, function, version, cold = response
        attributes["http.response.status_code"] = status_code
        attributes["fnrt.function"] = function
        attributes["fnrt.version"] = version
        if cold is not None:
            attributes["fnrt.cold_start"] = cold
    return attributes


def request_children(item: Flat) -> tuple[tuple[str, int, int, Mapping[str, Any]], ...]:
    """The children of a request (see :data:`Flat`), in the order they happened: its
    queue wait, those it carries (a load), the encoding of its answer."""
    queued, encoded = item[8], item[9]
    children: tuple[tuple[str, int, int, Mapping[str, Any]], ...] = item[11]
    if queued is not None:
        enqueued_ns, started_ns, priority = queued
        children = (("queue", enqueued_ns, started_ns, {"fnrt.priority": priority}), *children)
    if encoded is not None:
        started_ns, ended_ns, size = encoded
        children = (*children, ("encode", started_ns, ended_ns, {"fnrt.response.bytes": size}))
    return children


def span_of_request(item: Flat) -> Flat:
    """A request (see :data:`Flat`) as a span: a server span named by its method and
    route, with the attributes :func:`http_attributes` makes, then those set on it,
    and its children (:func:`request_children`)."""
    trace_id, span_id, state, parent, start_ns, end_ns, http, response, _, _, rare, _ = item
    attributes = http_attributes(http, response)
    extra, events, status, message = ({}, (), 0, "") if rare is None else rare
    attributes.update(extra)
    return (
        f"{http[0]} {http[1]}",
        SpanKind.SERVER + 0,
        trace_id,
        span_id,
        state,
        parent,
        start_ns,
        end_ns,
        attributes,
        events,
        (),
        status,
        message,
        request_children(item),
    )


def record_of(
    name: str, parent: SpanContext, start_ns: int, end_ns: int, attributes: Mapping[str, Any]
) -> Flat:
    """A record (see :data:`Flat`): a span of ``parent`` made after the fact."""
    trace_id, span_id, _, state, _ = parent
    return (name, trace_id, span_id, state, start_ns, end_ns, attributes)


def expand(item: Flat) -> list[Flat]:
    """``item`` (a request as a span) and, for a span, each child it carries as a record
    of its own."""
    if len(item) == REQUEST_FIELDS:
        item = span_of_request(item)
    if len(item) == RECORD_FIELDS or not item[13]:
        return [item]
    parent = SpanContext(item[2], item[3], True, item[4])
    return [item] + [record_of(name, parent, *rest) for name, *rest in item[13]]


def as_span(item: Span | Flat) -> Span:
    """``item`` as a :class:`Span` (a record gets its id here): what the in-memory and
    console exporters show."""
    if isinstance(item, Span):
        return item
    if len(item) == REQUEST_FIELDS:
        item = span_of_request(item)
    if len(item) == RECORD_FIELDS:
        name, trace_id, parent_id, state, start_ns, end_ns, attributes = item
        parent: SpanContext | None = SpanContext(trace_id, parent_id, True, state)
        context = SpanContext(trace_id, random.getrandbits(64) or 1, True, state)
        kind, events, links, status, message = SpanKind.INTERNAL, [], [], 0, ""
    else:
        (
            name,
            kind_value,
            trace_id,
            span_id,
            state,
            parent_fields,
            start_ns,
            end_ns,
            attributes,
            events,
            link_fields,
            status,
            message,
            _,
        ) = item
        parent = None if parent_fields is None else SpanContext(*parent_fields)
        context = SpanContext(trace_id, span_id, True, state)
        kind = SpanKind(kind_value)
        links = [SpanContext(*link) for link in link_fields]
    span = Span(name, context, parent, kind, start_ns, dict(attributes), links, None)
    span.events = list(events)
    span.set_status(StatusCode(status), message)
    span.end_ns = end_ns
    return span


_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_MAX_TRACE_STATE = 512


def parse_traceparent(value: str | None, trace_state: str | None = None) -> SpanContext | None:
    """The caller's span context from W3C headers; None when absent or malformed."""
    if not value:
        return None
    match = _TRACEPARENT.match(value.strip().lower())
    if match is None:
        return None
    version, trace_hex, span_hex, flags_hex, rest = match.groups()
    if version == "ff" or (version == "00" and rest):
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if not trace_id or not span_id:
        return None
    state = (trace_state or "").strip()
    return SpanContext(
        trace_id,
        span_id,
        bool(int(flags_hex, 16) & 1),
        state if len(state) <= _MAX_TRACE_STATE else "",
        remote=True,
    )


#: Where a ``traceparent`` (``00-{trace id}-{span id}-{flags}``) holds the trace's id and
#: the span's, in hex (the request log's ids).
TRACE_ID_CHARS = slice(3, 35)
SPAN_ID_CHARS = slice(36, 52)


def format_traceparent(context: SpanContext) -> str:
    # %-formatting: half the time of the f-string's format specs (a request writes one)
    trace_id, span_id, sampled, _, _ = context
    return "00-%032x-%016x-%s" % (trace_id, span_id, "01" if sampled else "00")  # noqa: UP031


# a SpanContext without NamedTuple's keyword handling (the hot path)
_context = tuple.__new__
_LOW64 = 0xFFFFFFFFFFFFFFFF


class Sampler:
    """OpenTelemetry's samplers: always on/off, trace-id ratio, each optionally parent-based."""

    def __init__(self, config: TraceConfig) -> None:
        name = config.sampler
        self.parent_based = name.startswith("parentbased_")
        root = name.removeprefix("parentbased_")
        ratio = (
            1.0 if root == "always_on" else 0.0 if root == "always_off" else config.sampler_ratio
        )
        # TraceIdRatioBased's rule: the low 64 bits of the trace id under ratio * 2^64
        self.bound = round(ratio * (1 << 64))

    def sampled(self, trace_id: int, parent: SpanContext | None) -> bool:
        if parent is not None and self.parent_based:
            return parent.sampled
        return (trace_id & _LOW64) < self.bound


#: Where ended sampled spans and records go, flat (an exporter's ``add``).
Sink = Callable[[Flat], None]


class Tracer:
    """Starts spans; ended sampled spans, and records, go to ``sink``."""

    def __init__(
        self,
        config: TraceConfig,
        sink: Sink,
        on_shutdown: Callable[[], None] | None = None,
        sink_many: Callable[[Sequence[Flat]], None] | None = None,
    ) -> None:
        self.config = config
        self.sampler = Sampler(config)
        self._sink = sink
        self._sink_many = sink_many
        self._on_shutdown = on_shutdown
        self._bits = random.getrandbits
        self._always_on = self.sampler.bound > _LOW64  # every new trace is sampled

    def shutdown(self) -> None:
        """Export what is still batched (at the end of a server or a CLI call)."""
        if self._on_shutdown is not None:
            self._on_shutdown()

    def export(self, items: Sequence[Flat]) -> None:
        """Hand ended spans (requests: :meth:`ServerSpan.ended`) to the sink at once."""
        if self._sink_many is not None:
            self._sink_many(items)
        else:
            for item in items:
                self._sink(item)

    def record(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext,
        *,
        kind: SpanKind,
        start_ns: int,
        end_ns: int,
        attributes: dict[str, Any],
        events: list[tuple[str, int, dict[str, Any]]],
        status: tuple[StatusCode, str],
    ) -> None:
        """Export a span that was made and ended elsewhere (a handler's own, in a worker)."""
        span = Span(name, context, parent, kind, start_ns, attributes, [], self._sink)
        span.events = tuple(events)
        span.set_status(*status)
        span.end(end_ns)

    def start(
        self,
        name: str,
        parent: SpanContext | None = None,
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: dict[str, Any] | None = None,
        links: list[SpanContext] | None = None,
        start_ns: int | None = None,
    ) -> Span:
        """A span under ``parent`` (a new trace when None); sampled by the sampler's rule."""
        if parent is not None and parent.sampled and self.sampler.parent_based:
            # the common case, a child of a recorded span: nothing to decide
            return Span(
                name,
                _context(
                    SpanContext,
                    (parent.trace_id, self._bits(64) or 1, True, parent.trace_state, False),
                ),
                parent,
                kind,
                start_ns or time_ns(),
                {} if attributes is None else attributes,
                () if links is None else links,
                self._sink,
            )
        context = self._context(parent)
        return Span(
            name,
            context,
            parent,
            kind,
            start_ns or time_ns(),
            {} if attributes is None else attributes,
            [] if links is None else links,
            self._sink if context.sampled else None,
        )

    def start_request(
        self, method: str, route: str, path: str, headers: Mapping[str, str]
    ) -> ServerSpan:
        """The span of one HTTP request (:meth:`start_server`), continuing the caller's
        trace when its headers (``traceparent``, ``tracestate``) name one. The data path's
        way in: the common case (every trace sampled, no caller's trace) builds the list
        here, in C, with no other Python frame."""
        if self._always_on and "traceparent" not in headers:
            trace_id, span_id = self._bits(128) or 1, self._bits(64) or 1
            span = ServerSpan(
                (
                    trace_id,
                    span_id,
                    "",
                    None,
                    time_ns(),
                    0,
                    (method, route, path, headers.get("user-agent", "")),
                    None,
                    None,
                    None,
                    None,
                    (),
                    self._sink,
                    None,
                )
            )
            span.context = _context(SpanContext, (trace_id, span_id, True, "", False))
            span.traceparent = "00-%032x-%016x-01" % (trace_id, span_id)  # noqa: UP031 (format_traceparent's)
            span.recording = True
            return span
        traceparent = headers.get("traceparent")
        parent = parse_traceparent(traceparent, headers.get("tracestate")) if traceparent else None
        # an unsampled span only carries ids (for traceresponse and the request log)
        return self.start_server((method, route, path, headers.get("user-agent", "")), parent)

    def start_server(self, http: Http, parent: SpanContext | None = None) -> ServerSpan:
        """The span of one request on the data path (a new trace when ``parent``, the
        caller's, is None); sampled by the sampler's rule."""
        context = self._context(parent)
        return server_span(
            context,
            parent,
            format_traceparent(context),
            http,
            time_ns(),
            self._sink if context.sampled else None,
        )

    def _context(self, parent: SpanContext | None) -> SpanContext:
        """A new span's context under ``parent``, sampled or not by the sampler's rule."""
        if parent is None:  # a new trace: TraceIdRatioBased's rule (Sampler.sampled)
            trace_id = self._bits(128) or 1
            sampled = (trace_id & _LOW64) < self.sampler.bound
            state = ""
        else:
            trace_id, state = parent.trace_id, parent.trace_state
            sampled = self.sampler.sampled(trace_id, parent)
        return _context(SpanContext, (trace_id, self._bits(64) or 1, sampled, state, False))
