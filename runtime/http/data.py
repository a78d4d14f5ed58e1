"""The one template of every data route: :func:`serve_data`, and the route table.

Invokes, OIP infers, split tails and generates are served as raw ASGI (they skip
Starlette's middleware, router and Request/Response objects: about a third of
the event loop's time per request when they did not). Each is a
:class:`DataRoute`: its body's limits, how it parses the body, how it decodes it
for the version chosen to answer, and how it answers. The template does the rest,
the same for all: the request's span and log line, the invoke key, the body, then
**route first** (the version is chosen), **decode against it** (the route builds
the request's one record, :class:`~fnrt.runtime.queue.Call`, through
``Gateway.call``), **submit** (the guards, admission, the queue), and one more
try on its successor when the version retired in between.

A request whose body is all here takes those steps with no task
(:func:`serve_now`, from the connection once its read is parsed): plain calls up
to the queue, and the answer written from the call's future's callback. Where a
step must wait, the rest goes to the same coroutines :func:`serve_data` runs, on
a task.

:data:`ROUTES` lists every data route once: :class:`FnrtApp` matches paths
against it before Starlette's router (:func:`match`), and the same table makes
the Starlette routes that serve them when that is bypassed (and give other
methods a 405 with ``Allow``).
"""

from __future__ import annotations

import asyncio
import functools
import math
import re
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

from uvicorn.protocols.http.httptools_impl import (
    HEADER_VALUE_RE,
    STATUS_LINE,
    RequestResponseCycle,
)

from fnrt.functions.errors import BadRequest, ClientLeft, FnrtError, VersionRetired
from fnrt.functions.generation import join_chunks
from fnrt.functions.headers import (
    FUNCTION_HEADER,
    PRIORITY_HEADER,
    TIMEOUT_HEADER,
    VERSION_HEADER,
)
from fnrt.runtime.gateway import Target
from fnrt.runtime.http.body import ClientGone, Receive, client_of, read_body, within
from fnrt.runtime.http.observe import Trail, end, server_span
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
    fmt: Any = None  # the body's format, where the route reads it from the headers
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

    def limits(self, incoming: Incoming) -> tuple[int, str]:
        """The most bytes its body may hold, and what a 413 tells the client to do
        instead; checks what can be checked of the headers before the body is read."""
        ...

    def parse(self, incoming: Incoming, raw: bytes) -> Any:
        """The body, all of it here, parsed as far as no version is needed."""
        ...

    def decode(self, incoming: Incoming, body: Any, scheduler: Scheduler) -> Call:
        """The request's record for ``scheduler``: ``body`` checked against its inputs."""
        ...


class DataRoute(DataSource, Protocol):
    """One data route: what the template does not."""

    def answer(self, incoming: Incoming, body: Any, call: Call, served: Served) -> Answer:
        """The encoded answer (the version that answered: ``answering(call)``; a
        generative function's whole result joined in ``served`` already)."""
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
    """The request's headers by name (the last of a repeated one), decoded; the names
    clients send are decoded once (half of the work a request, before)."""
    names = _NAMES
    headers: dict[str, str] = {}
    for raw, value in scope["headers"]:
        name = names.get(raw)
        if name is None:
            if len(names) >= _NAMES_MAX:  # any names a client sends: forget them all
                names.clear()
            name = names[raw] = raw.decode("latin-1")
        headers[name] = value.decode("latin-1")
    return headers


#: Header names as they arrive -> decoded (``header_map``).
_NAMES: dict[bytes, str] = {}
_NAMES_MAX = 1024


def open_request(
    node: Node, route: DataSource, params: tuple[str | None, ...], scope: Scope, receive: Receive
) -> Incoming:
    """The request's HTTP side: its headers, its span opened (``end`` closes it)."""
    headers = header_map(scope)
    span = server_span(node.telemetry, route.path, scope, headers)
    return Incoming(node, headers, params, receive, route.path, time.perf_counter(), span)


def _front(route: DataSource, incoming: Incoming) -> Target:
    """What the request asks for, and what its headers say before its body is read: the
    invoke key, the priority and timeout, the connection that tells if the client left."""
    node = incoming.node
    headers = incoming.headers
    target = route.target(incoming)
    if node.invoke_keys is not None:
        node.invoke_keys.check(target.function, headers)
    if PRIORITY_HEADER in headers or TIMEOUT_HEADER in headers:
        incoming.priority, incoming.timeout_s = request_options(headers)
    incoming.client = client_of(incoming.receive)
    return target


def _decoded(route: DataSource, incoming: Incoming, body: Any, scheduler: Scheduler) -> Call:
    """The request's record for ``scheduler``'s version (what it reached, on its trail)."""
    trail = incoming
    trail.function, trail.version = scheduler.name, scheduler.version.version
    return route.decode(incoming, body, scheduler)


async def submit_data(route: DataSource, incoming: Incoming) -> tuple[Any, Call, Served]:
    """The front half of every data route: the key, the body, the version chosen, the
    body decoded for it, and its answer from the gateway (one more try on the
    successor of a version that retired in between)."""
    target = _front(route, incoming)
    limit, hint = route.limits(incoming)
    settings = incoming.node.settings
    raw = await read_body(incoming.headers, incoming.receive, limit, hint, settings.body_timeout_s)
    body = route.parse(incoming, raw)
    gateway = incoming.node.gateway
    scheduler = gateway.choose_now(target)
    if scheduler is None:
        scheduler = await gateway.choose(target)
    call = _decoded(route, incoming, body, scheduler)
    call, served = await _served(route, incoming, target, body, call)
    return body, call, served


async def _served(
    route: DataSource,
    incoming: Incoming,
    target: Target,
    body: Any,
    call: Call,
    waiting: Awaitable[Served] | None = None,
) -> tuple[Call, Served]:
    """``call`` submitted (``waiting``: submitted already) and answered, with one more
    try on the successor of a version that retired in between: the call that was
    answered, and its answer."""
    gateway = incoming.node.gateway
    try:
        served = await (gateway.submit(call) if waiting is None else waiting)
    except VersionRetired:
        scheduler = await gateway.successor(target, call.scheduler)
        call = _decoded(route, incoming, body, scheduler)
        served = await gateway.submit(call)
    _reached(incoming, call, served)
    return call, served


def _reached(trail: Incoming, call: Call, served: Served) -> None:
    """What the request reached, for its metrics, log line and span."""
    by = answering(call)
    trail.function, trail.version = by.name, by.version.version
    trail.cold_tier = served.cold_tier


async def joined(call: Call, served: Served, trail: Incoming | Trail) -> Served:
    """A generative function's answer to an invoke or an infer, whole: every chunk joined
    (with the function's default parameters), and why it ended (``finish``)."""
    stream = served.stream
    assert stream is not None
    try:
        chunks = [chunk async for chunk in stream]
    finally:
        if not stream.done:
            stream.cancel()  # the client left while it ran
    assert stream.ended is not None
    outputs = join_chunks(answering(call).version.manifest.outputs, chunks)
    cold_tier = served.cold_tier
    if stream.cold_tier is not None:
        cold_tier = trail.cold_tier = stream.cold_tier
    return Served(outputs, cold_tier, served.cached, served.fallback, finish=stream.ended.reason)


async def _answered(
    route: DataRoute, incoming: Incoming, body: Any, call: Call, served: Served
) -> Answer:
    if served.stream is not None:  # a generative function: its whole result
        served = await joined(call, served, incoming)
    return route.answer(incoming, body, call, served)


async def _answer(route: DataRoute, incoming: Incoming) -> Answer:
    body, call, served = await submit_data(route, incoming)
    return await _answered(route, incoming, body, call, served)


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
    await _respond(route, incoming, scope, send, _answer(route, incoming))


async def _respond(
    route: DataRoute, incoming: Incoming, scope: Scope, send: Send, answer: Awaitable[Answer]
) -> None:
    status = await serve_raw(
        answer, scope, send, route.error_headers(incoming.headers), incoming.span
    )
    end(incoming.node.telemetry, incoming, status)


# --- a request served with no task of its own -----------------------------------------

#: Goes on with a request on a task of its connection's (the server waits for it as it
#: stops, and an error it raises is answered as an app's).
Spawn = Callable[["Answering", Coroutine[Any, Any, None]], None]


def serve_now(
    route: DataRoute,
    node: Node,
    params: tuple[str | None, ...],
    cycle: Answering,
    spawn: Spawn,
) -> bool:
    """Serve a request whose body is all here as :func:`serve_data` would, with no task
    of its own: the body parsed, the version chosen and the call queued now, and the
    answer written from its future's callback. A task per request and its
    coroutines' steps cost about a tenth of the event loop's time per request. A step
    that must wait (a version not routed here yet, a retired one, a generative
    answer, an error to answer, a client that does not take its answers) hands the
    rest to the same coroutines as :func:`serve_data`, on a task of ``spawn``'s. False,
    having done nothing: the body is not all here; serve it as a task."""
    if not cycle.body_here():
        return False
    scope: Any = cycle.scope  # (uvicorn's types of ASGI, which fnrt's routes take as plain)
    incoming = open_request(node, route, params, scope, cycle.receive)  # type: ignore[arg-type]
    try:
        target = _front(route, incoming)
        limit, hint = route.limits(incoming)
        raw = cycle.whole_body()
        assert raw is not None
        body = route.parse(incoming, within(raw, limit, hint))
        gateway = node.gateway
        scheduler = gateway.choose_now(target)
        if scheduler is None:
            rest = _chosen(route, incoming, target, body)
        else:
            call = _decoded(route, incoming, body, scheduler)
            try:
                waiting = gateway.submit(call)
            except VersionRetired as exc:
                waiting = _raise(exc)
            if isinstance(waiting, asyncio.Future):
                waiting.add_done_callback(
                    functools.partial(_on_served, route, incoming, cycle, spawn, target, body, call)
                )
                return True
            rest = _rest(route, incoming, target, body, call, waiting)
    except Exception as exc:  # answered as serve_data answers it
        rest = _raise(exc)
    spawn(cycle, _respond(route, incoming, scope, cycle.send, rest))  # type: ignore[arg-type]
    return True


def _on_served(
    route: DataRoute,
    incoming: Incoming,
    cycle: Answering,
    spawn: Spawn,
    target: Target,
    body: Any,
    call: Call,
    future: asyncio.Future[Served],
) -> None:
    """The call's future is done: its answer written now, unless it needs a wait."""
    status: int | None = None
    rest: Awaitable[Answer] | None = None
    try:
        if (
            future.cancelled()
            or future.exception() is not None
            or future.result().stream is not None
        ):
            # its error, a retired version's successor, a generative answer to join:
            # as serve_data meets them
            rest = _rest(route, incoming, target, body, call, future)
        else:
            served = future.result()
            _reached(incoming, call, served)
            answer = route.answer(incoming, body, call, served)
            status = write_now(cycle, answer, incoming.span)
            if status is None:  # the client has not taken the answer before: wait
                rest = _done(answer)
    except Exception as exc:
        rest = _raise(exc)
    if rest is not None:
        spawn(cycle, _respond(route, incoming, cycle.scope, cycle.send, rest))  # type: ignore[arg-type]
    elif status is not None:
        end(incoming.node.telemetry, incoming, status)


async def _chosen(route: DataRoute, incoming: Incoming, target: Target, body: Any) -> Answer:
    scheduler = await incoming.node.gateway.choose(target)
    call = _decoded(route, incoming, body, scheduler)
    return await _rest(route, incoming, target, body, call, None)


async def _rest(
    route: DataRoute,
    incoming: Incoming,
    target: Target,
    body: Any,
    call: Call,
    waiting: Awaitable[Served] | None,
) -> Answer:
    call, served = await _served(route, incoming, target, body, call, waiting)
    return await _answered(route, incoming, body, call, served)


async def _raise(exc: Exception) -> Any:
    try:
        raise exc
    finally:
        # its traceback holds this frame: without the name, no cycle is left for the
        # garbage collector (at 17,000 refusals a second, a collection every few ms)
        del exc


async def _done(answer: Answer) -> Answer:
    return answer


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
    if isinstance(cycle, Answering):  # the connection writes it whole
        while (written := write_now(cycle, (body, media_type, extra), span, status)) is None:
            await cycle.flow.drain()  # the answer before is not taken yet: wait, as send does
            if cycle.disconnected:  # (else a pipeline's answers piled up unsent)
                return CLIENT_GONE
        return written
    if getattr(cycle, "disconnected", False) and not hasattr(cycle, "refused"):
        return CLIENT_GONE  # it left while the request ran: the answer reaches nobody
    if getattr(cycle, "waiting_for_100_continue", False):
        cycle.keep_alive = False  # (as write_now says)
    trace_header = traceresponse(span)
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


def write_now(cycle: Answering, answer: Answer, span: Any, status: int = 200) -> int | None:
    """Write ``answer`` on its connection, whole; the status written (499 when the client
    left first), or None when the client has not taken the answer before yet (wait for
    ``cycle.flow.drain()``, then write)."""
    if cycle.disconnected and not hasattr(cycle, "refused"):
        # it left while the request ran: the answer reaches nobody (a body the connection
        # refused, too slow, was answered 408 there: ``refused``)
        return CLIENT_GONE
    if cycle.waiting_for_100_continue:
        # answered before its body was asked for (no 100 Continue): the client need not
        # send it, and kept open the connection would read its next request as that body
        cycle.keep_alive = False
    if cycle.flow.write_paused:
        return None
    body, media_type, extra = answer
    if isinstance(extra, Head):
        lines = extra.lines
    else:
        lines = header_lines(_raw_headers(media_type, extra))
    trace_header = traceresponse(span)
    if trace_header is not None:  # fnrt's own: hex digits and dashes
        lines += b"%s: %s\r\n" % trace_header
    cycle.answer(status, lines, body)
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

    def body_here(self) -> bool:
        """All of the request's body is here, and nothing more is owed to the client
        first (a ``100 Continue``)."""
        return not (
            self.more_body
            or self.waiting_for_100_continue
            or self.disconnected
            or self.response_complete
        )

    def whole_body(self) -> bytes | None:
        """The request's body when it is here (:meth:`body_here`), taken; None: read it
        through ``receive``."""
        if not self.body_here():
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


#: Serves one matched request whose body is all here with no task (``serve_now``):
#: (node, the path's parameters, the connection's request cycle, spawn); False: not.
Now = Callable[[Node, tuple[str | None, ...], Answering, Spawn], bool]


@dataclass(frozen=True)
class Entry:
    """A data route's path (Starlette's syntax), its matcher, and what serves it (as
    ASGI, and, where it can, with no task: ``now``)."""

    path: str
    serve: Serve
    pattern: re.Pattern[str]
    names: tuple[str, ...]  # the path's parameters, in order
    now: Now | None = None


def entry(path: str, serve: Serve, now: Now | None = None) -> Entry:
    """The table's entry for ``path``: ``{param}`` matches one path segment."""
    names = tuple(re.findall(r"{(\w+)}", path))
    regex = re.sub(r"\\{\w+\\}", "([^/]+)", re.escape(path))
    return Entry(path, serve, re.compile(regex), names, now)


def data_entry(path: str, route: DataRoute) -> Entry:
    """The table's entry for a data route: ``serve_data``, and ``serve_now``."""

    def serve(
        node: Node, params: tuple[str | None, ...], scope: Scope, receive: Receive, send: Send
    ) -> Awaitable[None]:
        return serve_data(route, node, params, scope, receive, send)

    return entry(path, serve, functools.partial(serve_now, route))


@dataclass(frozen=True, slots=True)
class Bound:
    """A matched entry with its node and the path's parameters: the ASGI app of one
    request (a connection's pipelined one, say), and its way to be served now."""

    entry: Entry
    node: Node
    params: tuple[str | None, ...]

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        return self.entry.serve(self.node, self.params, scope, receive, send)

    def now(self, cycle: Answering, spawn: Spawn) -> bool:
        """Serve it with no task of its own (:func:`serve_now`); False: not."""
        now = self.entry.now
        return now is not None and now(self.node, self.params, cycle, spawn)


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
