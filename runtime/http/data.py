"""The one template of every data route: :func:`serve_data`, and the route table.

Invokes, OIP infers, split tails and generates are served as raw ASGI (they skip
Starlette's middleware, router and Request/Response objects: about a third of
the event loop's time per request when they did not). Each is a
:class:`DataRoute`: how it reads its body, how it decodes it for the version
chosen to answer, and how it answers. The template does the rest, the same for
all: the request's span and log line, the invoke key, the body, then **route
first** (the version is chosen), **decode against it** (the route builds the
request's one record, :class:`~fnrt.runtime.queue.Call`, through
``Gateway.call``), **submit** (the guards, admission, the queue), and one more
try on its successor when the version retired in between.

:data:`ROUTES` lists every data route once: :class:`FnrtApp` matches paths
against it before Starlette's router (:func:`match`), and the same table makes
the Starlette routes that serve them when that is bypassed (and give other
methods a 405 with ``Allow``).
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

from uvicorn.protocols.http.httptools_impl import (
    HEADER_VALUE_RE,
    STATUS_LINE,
    RequestResponseCycle,
)

from fnrt.functions.errors import BadRequest, ClientLeft, FnrtError, VersionRetired
from fnrt.functions.headers import (
    FUNCTION_HEADER,
    PRIORITY_HEADER,
    TIMEOUT_HEADER,
    VERSION_HEADER,
)
from fnrt.runtime.gateway import Target
from fnrt.runtime.http.body import ClientGone, Receive, client_of
from fnrt.runtime.http.observe import end, server_span
from fnrt.runtime.http.problems import problem, unexpected
from fnrt.runtime.http.state import Node
from fnrt.runtime.protection import Served
from fnrt.runtime.queue import Call, Client, Priority
from fnrt.runtime.scheduler import Scheduler
from fnrt.tracing.spans import fail, traceresponse

Scope = MutableMapping[str, Any]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
#: Response headers encoded for ASGI.
RawHeaders = list[tuple[bytes, bytes]]


@dataclass(frozen=True, slots=True)
class Head:
    """An answer's headers encoded once (:func:`answered_by`): for ASGI, and as the
    lines of an HTTP head for a connection that writes the answer whole."""

    raw: RawHeaders
    lines: bytes


#: body, media type, extra headers (or, encoded, the content type and extra headers)
Answer = tuple[bytes, str, "dict[str, str] | Head"]

#: What metrics and logs record for a request whose client left before the answer.
CLIENT_GONE = 499


@dataclass(slots=True)
class Incoming:
    """The HTTP side of one data request, as the template hands it to its route."""

    node: Node
    headers: Mapping[str, str]
    params: tuple[str | None, ...]  # the path's parameters, in the route's order
    receive: Receive
    route: str  # the route's path template: its name in metrics, logs and spans
    started_s: float  # time.perf_counter() when it began
    span: Any  # its server span, when tracing is on
    priority: Priority | None = None  # from the headers (a body's may add to them)
    timeout_s: float | None = None
    client: Client | None = None
    reply: Any = None  # the route's choice of answer format, made before the body is read
    function: str = ""  # what it reached, for its metrics, log line and span (a Trail)
    version: str = ""
    cold_tier: str | None = None

    def call(
        self,
        scheduler: Scheduler,
        inputs: Any,
        priority: Priority | None = None,
        timeout_s: float | None = None,
        **extra: Any,
    ) -> Call:
        """The request's record for ``scheduler``: headers win over the body's own
        priority and timeout (``priority``, ``timeout_s``)."""
        return self.node.gateway.call(
            scheduler,
            inputs,
            priority if self.priority is None else self.priority,
            timeout_s if self.timeout_s is None else self.timeout_s,
            span=self.span,
            client=self.client,
            **extra,
        )


class DataSource(Protocol):
    """The front half of a data route: what it asks for, and its body read and decoded."""

    #: the path as Starlette writes it; the route's name in metrics, logs and spans
    path: str

    def target(self, incoming: Incoming) -> Target:
        """What the request asks for (BadRequest for a malformed path)."""
        ...

    def read(self, incoming: Incoming) -> Awaitable[Any]:
        """The body, read within its limits and parsed as far as no version is needed."""
        ...

    def decode(self, incoming: Incoming, body: Any, scheduler: Scheduler) -> Call:
        """The request's record for ``scheduler``: ``body`` checked against its inputs."""
        ...


class DataRoute(DataSource, Protocol):
    """One data route: what the template does not."""

    def answer(
        self, incoming: Incoming, body: Any, call: Call, served: Served
    ) -> Awaitable[Answer]:
        """The encoded answer (the version that answered: ``answering(call)``)."""
        ...

    def error_headers(self, headers: Mapping[str, str]) -> Mapping[str, str]:
        """The headers that decide an error's format (OIP's are always JSON)."""
        ...


def request_options(headers: Mapping[str, str]) -> tuple[Priority | None, float | None]:
    """Priority and timeout from the request headers; BadRequest if malformed."""
    priority = None
    if PRIORITY_HEADER in headers:
        try:
            priority = Priority.parse(headers[PRIORITY_HEADER])
        except ValueError as exc:
            raise BadRequest(f"{PRIORITY_HEADER}: {exc}") from None
    timeout_s = None
    if TIMEOUT_HEADER in headers:
        text = headers[TIMEOUT_HEADER]
        try:
            timeout_ms = float(text)
        except ValueError:
            raise BadRequest(
                f"{TIMEOUT_HEADER}: {text!r} is not a number of milliseconds"
            ) from None
        if not 0 < timeout_ms < math.inf:
            raise BadRequest(f"{TIMEOUT_HEADER}: must be > 0")
        # any value > 0 the document allows (5e-324 too: it expires at once, 504); never
        # 0 s, which would read as no deadline at all
        timeout_s = max(timeout_ms / 1000.0, sys.float_info.min)
    return priority, timeout_s


def answering(call: Call) -> Scheduler:
    """The version that answered ``call``: its own, or the fallback function's."""
    scheduler: Scheduler = call.answered_by or call.scheduler
    return scheduler


_ENCODED: dict[tuple[str, str, str], Head] = {}


def answered_by(function: str, version: str, media_type: str) -> Head:
    """The headers of an answer computed by ``function``'s ``version`` (no cache hit, no
    fallback, no cold start), encoded once per version and media type."""
    key = (function, version, media_type)
    found = _ENCODED.get(key)
    if found is None:
        if len(_ENCODED) > 4096:  # versions come and go: forget them all now and then
            _ENCODED.clear()
        raw = [
            (b"content-type", media_type.encode()),
            (FUNCTION_HEADER.encode(), function.encode("latin-1")),
            (VERSION_HEADER.encode(), version.encode("latin-1")),
        ]
        found = _ENCODED[key] = Head(raw, header_lines(raw))
    return found


def header_map(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


def open_request(
    node: Node, route: DataSource, params: tuple[str | None, ...], scope: Scope, receive: Receive
) -> Incoming:
    """The request's HTTP side: its headers, its span opened (``end`` closes it)."""
    headers = header_map(scope)
    span = server_span(node.telemetry, route.path, scope, headers)
    return Incoming(node, headers, params, receive, route.path, time.perf_counter(), span)


async def submit_data(route: DataSource, incoming: Incoming) -> tuple[Any, Call, Served]:
    """The front half of every data route: the key, the body, the version chosen, the
    body decoded for it, and its answer from the gateway (one more try on the
    successor of a version that retired in between)."""
    node = incoming.node
    headers = incoming.headers
    target = route.target(incoming)
    if node.invoke_keys is not None:
        node.invoke_keys.check(target.function, headers)
    if PRIORITY_HEADER in headers or TIMEOUT_HEADER in headers:
        incoming.priority, incoming.timeout_s = request_options(headers)
    incoming.client = client_of(incoming.receive)
    body = await route.read(incoming)
    gateway = node.gateway
    scheduler = gateway.choose_now(target)
    if scheduler is None:
        scheduler = await gateway.choose(target)
    trail = incoming  # what it reached, for its metrics, log line and span
    trail.function, trail.version = scheduler.name, scheduler.version.version
    call = route.decode(incoming, body, scheduler)
    try:
        served = await gateway.submit(call)
    except VersionRetired:
        scheduler = await gateway.successor(target, scheduler)
        trail.version = scheduler.version.version
        call = route.decode(incoming, body, scheduler)
        served = await gateway.submit(call)
    by = answering(call)
    trail.function, trail.version = by.name, by.version.version
    trail.cold_tier = served.cold_tier
    return body, call, served


async def _answer(route: DataRoute, incoming: Incoming) -> Answer:
    body, call, served = await submit_data(route, incoming)
    return await route.answer(incoming, body, call, served)


async def serve_data(
    route: DataRoute,
    node: Node,
    params: tuple[str | None, ...],
    scope: Scope,
    receive: Receive,
    send: Send,
) -> None:
    """Answer one request of ``route`` on the raw ASGI interface."""
    incoming = open_request(node, route, params, scope, receive)
    status = await serve_raw(
        _answer(route, incoming), scope, send, route.error_headers(incoming.headers), incoming.span
    )
    end(node.telemetry, incoming, status)


async def serve_raw(
    answer: Awaitable[Answer],
    scope: Scope,
    send: Send,
    error_headers: Mapping[str, str],
    span: Any = None,
) -> int:
    """Send ``answer``'s response, or the error it raised (formatted for ``error_headers``);
    the status sent (499 when the client left first). Errors are recorded on ``span``."""
    try:
        body, media_type, extra = await answer
        status = 200
    except (ClientGone, ClientLeft):
        return CLIENT_GONE  # nobody to answer
    except FnrtError as exc:
        failed = problem(exc, error_headers)
        fail(span, exc, server_fault=failed.status >= 500)
        status, body, media_type, extra = (
            failed.status,
            failed.body,
            failed.media_type,
            failed.headers,
        )
    except Exception as exc:
        fail(span, exc)
        failed = unexpected(scope["method"], scope["path"], exc, error_headers)
        status, body, media_type, extra = (
            failed.status,
            failed.body,
            failed.media_type,
            failed.headers,
        )
    cycle: Any = getattr(send, "__self__", None)  # uvicorn's request cycle, where there is one
    if getattr(cycle, "disconnected", False) and not hasattr(cycle, "refused"):
        # it left while the request ran: the answer reaches nobody (a body the connection
        # refused, too slow, was answered 408 there: ``refused``)
        return CLIENT_GONE
    if getattr(cycle, "waiting_for_100_continue", False):
        # answered before its body was asked for (no 100 Continue): the client need not
        # send it, and kept open the connection would read its next request as that body
        cycle.keep_alive = False
    trace_header = traceresponse(span)
    write = getattr(cycle, "answer", None)
    if write is not None:  # the connection writes it whole (connection.Answering)
        if cycle.flow.write_paused:  # the answer before is not taken yet: wait, as send does
            await cycle.flow.drain()  # (else a pipeline's answers piled up unsent)
            if cycle.disconnected:
                return CLIENT_GONE
        if isinstance(extra, Head):
            lines = extra.lines
        else:
            lines = header_lines(_raw_headers(media_type, extra))
        if trace_header is not None:  # fnrt's own: hex digits and dashes
            lines += b"%s: %s\r\n" % trace_header
        write(status, lines, body)
        return status
    if isinstance(extra, Head):  # encoded already: the content type and who answered
        raw = [*extra.raw, (b"content-length", str(len(body)).encode())]
    else:
        raw = _raw_headers(media_type, extra)
        raw.append((b"content-length", str(len(body)).encode()))
    if trace_header is not None:
        raw.append(trace_header)
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
    return status


def _raw_headers(media_type: str, extra: Mapping[str, str]) -> RawHeaders:
    raw = [(b"content-type", media_type.encode())]
    raw += [(k.encode(), v.encode("latin-1")) for k, v in extra.items()]
    return raw


# --- the connection's answer (no ASGI messages) ----------------------------------------


class Answering(RequestResponseCycle):
    """uvicorn's request cycle with two shortcuts for the data routes, which read one
    whole body and send one whole answer: the body taken as it lies when all of it
    has arrived (no wait on an event, no message), and the answer written in one
    call (no two ASGI messages, one write). Everything the connection's sweep and
    uvicorn read of a cycle (``response_complete``, ``keep_alive``, ``more_body``,
    ``disconnected``) stays as the ASGI interface leaves it."""

    def whole_body(self) -> bytes | None:
        """The request's body when all of it is here and nothing more is owed to the
        client first (a ``100 Continue``); None: read it through ``receive``."""
        if self.more_body or self.waiting_for_100_continue or self.disconnected:
            return None
        if self.response_complete:
            return None
        body = bytes(self.body)
        self.body = bytearray()
        return body

    def answer(self, status: int, lines: bytes, body: bytes) -> None:
        """Send the whole response in one write: ``lines``, the header lines of
        :func:`header_lines` (no ``content-length``: this adds it), then ``body``;
        as ``send`` would with the two ASGI messages."""
        if self.disconnected:
            return
        if self.response_started:
            raise RuntimeError("the response was started already")
        self.response_started = True
        self.waiting_for_100_continue = False
        head = (
            STATUS_LINE[status],
            _default_lines(self.default_headers),
            lines,
            b"content-length: %d\r\n" % len(body),
            b"\r\n" if self.keep_alive else b"connection: close\r\n\r\n",
            body,
        )
        # through OneWrite: with the other answers of this turn, at its end. Written at
        # once instead, the loop sat idle a fifth of the time under 32 connections and
        # served 0.8x the requests/s (interleaved runs, 2026-12-06)
        self.transport.write(b"".join(head))
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()


def header_lines(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """``headers`` as the lines of an HTTP head, each value checked as uvicorn checks
    it (no line breaks or control characters); names are fnrt's own."""
    lines: list[bytes] = []
    for name, value in headers:
        if HEADER_VALUE_RE.search(value):
            raise ValueError(f"header {name!r}: a value with control characters")
        lines += (name, b": ", value, b"\r\n")
    return b"".join(lines)


#: uvicorn's default headers (``date``, ``server``) as lines: the list they were made
#: from (uvicorn makes a new one each second) and the lines.
_DEFAULTS: list[Any] = [None, b""]


def _default_lines(defaults: list[tuple[bytes, bytes]]) -> bytes:
    if defaults is not _DEFAULTS[0]:
        _DEFAULTS[:] = [defaults, b"".join(b"%s: %s\r\n" % pair for pair in defaults)]
    lines: bytes = _DEFAULTS[1]
    return lines


# --- the route table -----------------------------------------------------------------

#: Serves one matched request: (node, the path's parameters, scope, receive, send).
Serve = Callable[[Node, tuple[str | None, ...], Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class Entry:
    """A data route's path (Starlette's syntax), its matcher, and what serves it."""

    path: str
    serve: Serve
    pattern: re.Pattern[str]
    names: tuple[str, ...]  # the path's parameters, in order


def entry(path: str, serve: Serve) -> Entry:
    """The table's entry for ``path``: ``{param}`` matches one path segment."""
    names = tuple(re.findall(r"{(\w+)}", path))
    regex = re.sub(r"\\{\w+\\}", "([^/]+)", re.escape(path))
    return Entry(path, serve, re.compile(regex), names)


def data_route(route: DataRoute) -> Serve:
    """``serve_data`` for ``route``, as a table's entry calls it."""

    def serve(
        node: Node, params: tuple[str | None, ...], scope: Scope, receive: Receive, send: Send
    ) -> Awaitable[None]:
        return serve_data(route, node, params, scope, receive, send)

    return serve


def match(table: tuple[Entry, ...], path: str) -> tuple[Entry, tuple[str, ...]] | None:
    """The entry that ``path`` is, and its parameters; None if none is."""
    for item in table:
        found = item.pattern.fullmatch(path)
        if found is not None:
            return item, found.groups()
    return None


class _Endpoint:
    """An entry as a Starlette route's ASGI app (an instance: Starlette calls it as ASGI)."""

    def __init__(self, item: Entry) -> None:
        self.item = item

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = scope["path_params"]
        params = tuple(found.get(name) for name in self.item.names)
        await self.item.serve(scope["app"].state.node, params, scope, receive, send)


def starlette_routes(table: tuple[Entry, ...]) -> list[Any]:
    """The same entries as Starlette routes (POST only)."""
    from starlette.routing import Route

    return [Route(item.path, _Endpoint(item), methods=["POST"]) for item in table]
