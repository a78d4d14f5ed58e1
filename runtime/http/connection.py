"""Connections that cannot hold the node: read deadlines and a cap that evicts idle ones.

uvicorn times out idle keep-alive connections (here the sweep below does, at
uvicorn's ``timeout_keep_alive``: a timer armed at every answer cost a
microsecond a request), but a connection that sends its request head a byte
at a time (slowloris), or never sends one, is held forever; and every held
connection is a file descriptor. 1,100 of them against a limit of 1,024 left
none for the store: 39 of 40 normal requests failed. :class:`GuardedProtocol` is
uvicorn's httptools protocol with:

- a deadline for a request: a connection with none in progress (fresh, sending
  a head, or idle between requests) for ``header_timeout_s`` is answered 408
  and closed. A head dribbled a byte at a time never completes, so it is cut
  off however it trickles;
- a minimum rate for a request body (``pace``): each window of
  ``body_rate_window_s`` spent waiting on the client must bring
  ``min_body_rate_bytes_s`` times as many bytes, else 408 and the connection
  closes. A body trickled a byte a second never stalls long enough to trip a
  deadline between reads, so without it 770 such bodies held every
  connection the node allows (45 of 50 normal requests were refused 503).
  The same minimum holds for an answer the client does not take: a connection
  whose unsent answer drains slower than it is cut off (its descriptor and the
  answer's memory are freed; a close would wait for ever to flush);
- a cap on open connections. At the cap a new connection closes the worst
  offender: one already closing, then the slowest body or answer under the
  minimum rate, then the connection longest without a request (fresh, or a
  head still arriving), and only then the connection kept alive longest
  between two requests of a client that behaves. Only when every connection
  has a request in progress at a good pace is the new one refused (503).

A request's body has a deadline between reads too, ``body_timeout_s``, kept
by ``body.read_body`` (a request read whole in one go, the usual case, waits
on no timer). The cap sits below the process's descriptor limit by a reserve
for the store, the disk cache and worker processes (:func:`connection_cap`).
Per request, nothing more than counting a body's bytes: a sweep every
``SWEEP_S`` checks the deadlines and the rates.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import resource
import sys
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from fnrt.functions.errors import BodyTooSlow
from fnrt.runtime.http.data import Answering
from fnrt.runtime.http.fields import refusal, refusing_app
from fnrt.runtime.http.pace import Meter, Pace
from fnrt.runtime.lifecycle import Lifecycle

log = logging.getLogger("fnrt.http")


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 1024
    min_body_rate_bytes_s: float = 500.0  # 0: no minimum
    body_rate_window_s: float = 10.0

    def __post_init__(self) -> None:
        if self.header_timeout_s <= 0 or self.body_timeout_s <= 0:
            raise ValueError("header_timeout_s and body_timeout_s: must be > 0")
        if self.max_connections < 1:
            raise ValueError("max_connections: must be at least 1")
        if not self.min_body_rate_bytes_s >= 0:
            raise ValueError("min_body_rate_bytes_s: must be >= 0 (0: no minimum)")
        if not self.body_rate_window_s > 0:
            raise ValueError("body_rate_window_s: must be > 0")

    @functools.cached_property
    def pace(self) -> Pace:
        return Pace(self.min_body_rate_bytes_s, self.body_rate_window_s)


def raise_descriptor_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit; the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # a container may refuse: keep the soft limit
            pass
    return soft


def connection_cap(asked: int | None, descriptors: int, reserve: int) -> int:
    """At most ``asked`` connections, and never more than ``descriptors - reserve``."""
    room = max(descriptors - reserve, 16)
    return room if asked is None else min(asked, room)


#: How often connections are checked against their deadline: it is enforced within
#: this much after it passes.
SWEEP_S = 0.25
#: A sweep late by more than this (the event loop was busy) counts only this much of
#: waiting against a client: the loop was not reading what the client sent meanwhile.
MAX_SWEEP_GAP_S = 2 * SWEEP_S


def _closing_answer(status: str, error: str, *headers: str) -> bytes:
    """A whole HTTP/1.1 response written straight to a connection about to close."""
    body = json.dumps({"error": error}).encode()
    head = [f"HTTP/1.1 {status}", "content-type: application/json", *headers]
    head += ["connection: close", f"content-length: {len(body)}"]
    return "\r\n".join(head).encode() + b"\r\n\r\n" + body


_BUSY = _closing_answer(
    "503 Service Unavailable",
    "the server has as many connections as it allows, all busy; retry later",
    "retry-after: 1",
)
_HEAD_TIMEOUT = _closing_answer("408 Request Timeout", "the request head did not arrive in time")


def _malformed_answer(error: BaseException | None, fallback: str) -> bytes:
    """The 400 for a request the parser refused, naming why (llhttp's reason; a
    callback's own error, such as a URL too long, where it raised one)."""
    cause = error.__context__ if isinstance(error, httptools.HttpParserCallbackError) else error
    reason = str(cause)[:200] if cause is not None else fallback
    return _closing_answer("400 Bad Request", f"malformed HTTP request: {reason}")


#: The most of a request head held while it is still arriving (h11, uvicorn's other
#: parser, stops at 16 KiB; nginx's default buffers at 32 KiB). httptools sets none: a
#: head that never ended was held until its deadline, 100 MiB for 13 MB of small
#: fields, and one long value was joined again at each read (quadratic).
MAX_HEAD_BYTES = 64 * 1024
_HEAD_TOO_LARGE = _closing_answer(
    "431 Request Header Fields Too Large",
    f"the request head is larger than the limit of {MAX_HEAD_BYTES} bytes (64 KiB)",
)


_ORDER = itertools.count()  # orders connections made within one tick of the loop's clock


class OneWrite:
    """A transport whose writes within one turn of the event loop leave together.

    uvicorn writes a response's head when the app starts it and its body when
    the app sends it: two writes, two segments. A node killed between them
    leaves its peer a head without a body, which no proxy can pass on to
    another node (nginx has already started answering its client). Held to the
    end of the turn, head and body leave in one ``writev``: a kill lands before
    the answer (the proxy retries elsewhere) or after it, never inside. One
    system call per answer instead of two.

    The connections of one server share ``flushing``: the turn's first write
    schedules one flush of all of them (a batch's answers, one handle), not one
    each.
    """

    __slots__ = ("_flushing", "_loop", "_pending", "_transport", "written")

    def __init__(
        self,
        transport: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
        flushing: list[OneWrite] | None = None,
    ) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] | None = None
        self._flushing: list[OneWrite] = [] if flushing is None else flushing
        self.written = 0  # bytes written in all: the sweep measures how fast they leave

    def write(self, data: bytes) -> None:
        self.written += len(data)
        if self._pending is None:
            self._pending = [data]
            flushing = self._flushing
            if not flushing:
                self._loop.call_soon(_flush_all, flushing)
            flushing.append(self)
        else:
            self._pending.append(data)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def _flush(self) -> None:
        pending, self._pending = self._pending, None
        if pending and not self._transport.is_closing():
            self._transport.writelines(pending)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _flush_all(flushing: list[OneWrite]) -> None:
    """The turn's held writes, each connection's in one call (a write made meanwhile
    schedules the next turn's); one that fails is logged, as the loop would log a
    handle of its own, and the others are written all the same."""
    ones = flushing.copy()
    flushing.clear()
    for one in ones:
        try:
            one._flush()
        except Exception:
            log.exception("writing a connection's answers failed")


#: What answers a data route on the connection itself: the path -> that request's
#: route with its parameters (``data.Bound``: an ASGI app, and ``now``), or None for any
#: other path.
DataApps = Callable[[str], Any]


#: The longest URL httptools' ``parse_url`` takes (uvicorn answers a longer one 400).
_URL_PARSED_MAX = 65_535

#: When the server stops, how long a connection accepted but not yet read may still
#: send its first request (it was opened to send one).
FIRST_REQUEST_GRACE_S = 0.5


class _Rest:
    """The rest of a request served now, as the ASGI app of its request cycle."""

    __slots__ = ("rest",)

    def __init__(self, rest: Coroutine[Any, Any, None]) -> None:
        self.rest = rest

    def __call__(self, scope: Any, receive: Any, send: Any) -> Coroutine[Any, Any, None]:
        return self.rest


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a request deadline, a minimum transfer rate and
    an evicting connection cap.

    Subclassed per server by :func:`guarded_protocol`, which sets ``limits`` and
    the node's ``lifecycle``. Per request it only looks whether the node is
    draining (then the answer says ``Connection: close``, so the client goes
    elsewhere next time) and counts the body's bytes; a sweep (one timer for the
    server, every ``SWEEP_S``) reads each connection's state from uvicorn's own
    request cycle and flow control, and the connection to evict is looked for only
    at the cap."""

    limits: ConnectionLimits = ConnectionLimits()
    lifecycle: Lifecycle | None = None
    data_apps: DataApps | None = None  # the data routes, served without the ASGI app
    _closing_at: float | None = None  # the server stops: close when idle past this time
    _state: object = None  # the request cycle the sweep saw last (or that just ended)
    _head_read = False  # the request's head has been read
    _head_bytes = 0  # bytes read while the head was arriving (from the read it began in)
    _malformed: bytes | None = None  # a request refused 400, after the answers before it
    _ready: tuple[Answering, Any] | None = None  # a data request to start once its read is parsed
    sweeping: list[asyncio.TimerHandle | None] = [None]  # the server's sweep timer
    swept_at: list[float] = [0.0]  # when the server's sweep last ran (the loop's clock)
    flushing: list[OneWrite] | None = None  # the server's connections with writes held

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_read = False
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._head_read = True
        headers = self.headers
        refused = None
        if len(headers) != len(fields := dict(headers)) or b"transfer-encoding" in fields:
            refused = refusal(headers)
        if refused is not None:  # answered in place of the route, as any request is
            routed, self.app = self.app, refusing_app(refused)
            try:
                super().on_headers_complete()
            finally:
                self.app = routed
        elif not (self.data_apps is not None and self._start_data(self.data_apps)):
            super().on_headers_complete()
        # a chunked body's trailer fields go on arriving through on_header: into a copy,
        # never into the request's headers (RFC 9110 6.5.1; uvicorn added them, and they
        # won), at no cost per field
        self.headers = list(self.headers)
        self._upload.restart(self._received)
        lifecycle = self.lifecycle
        if self.cycle is not None and (
            (lifecycle is not None and lifecycle.draining) or self._closing_at is not None
        ):
            self.cycle.keep_alive = False  # this answer closes the connection

    def send_400_response(self, msg: str) -> None:
        """A request the parser refuses: 400 and close, as uvicorn does, but in JSON
        naming why, and after the answers of the pipelined requests before it (uvicorn
        wrote it at once, ahead of them: their client read it as the first one's
        answer). Nothing more is read."""
        if self._malformed is not None:
            return  # held already: what came after it is not read
        answer = _malformed_answer(sys.exc_info()[1], msg)  # (called where uvicorn caught it)
        cycle, pipeline = self.cycle, self.pipeline
        if cycle is not None and cycle.more_body:  # refused within this request's body
            if not (pipeline and pipeline[0][0] is cycle):
                self._send_malformed(answer)  # the request in progress is the one
                return
            pipeline.popleft()  # a pipelined one, never started: dropped
            cycle.more_body = False  # (no body awaited: no deadline, no rate for it)
        elif cycle is None or cycle.response_complete:
            self._send_malformed(answer)
            return
        self._malformed = answer
        self.transport.pause_reading()

    def _send_malformed(self, answer: bytes) -> None:
        self.transport.write(answer)
        self.transport.close()  # once what is written before it has left

    def on_response_complete(self) -> None:
        """uvicorn's, less its keep-alive timer (armed at every answer and cancelled at
        the next request: about a microsecond a request); the sweep closes a connection
        idle for ``timeout_keep_alive`` instead (:meth:`_check`)."""
        last = not self.pipeline
        self.server_state.total_requests += 1
        # idle from now (the sweep would see it up to SWEEP_S late, or, having seen the
        # request in progress, count from up to SWEEP_S before its end)
        self._state, self._since = self.cycle, self.loop.time()
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:  # the next pipelined request, started
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        if last and self._malformed is not None:  # the answers before it are out
            self._send_malformed(self._malformed)
        elif self._head_bytes > MAX_HEAD_BYTES and not self._head_read:
            self._drop(_HEAD_TOO_LARGE)  # the next head, held until this answer was out

    def data_received(self, data: bytes) -> None:
        self._received_data(data)
        ready = self._ready
        if ready is not None:  # a data request's head was read (``_start_data``)
            self._ready = None
            self.loop.call_soon(self._serve_ready, *ready)

    def _serve_ready(self, cycle: Answering, app: Any) -> None:
        try:
            served = app.now(cycle, self._spawn)
        except Exception:  # raised before its body was taken: the task meets it again,
            served = False  # and answers it as uvicorn answers an app's error
        if not served:
            self._start_asgi_task(cycle, app)

    def _spawn(self, cycle: Answering, rest: Coroutine[Any, Any, None]) -> None:
        """The rest of a request served now, on a task run as uvicorn runs an app's: the
        server waits for it as it stops, and an error it raises is logged and answered
        500 (or the connection closed, when the answer was begun)."""
        self._start_asgi_task(cycle, _Rest(rest))

    def _received_data(self, data: bytes) -> None:
        if self._head_read:
            super().data_received(data)
            return
        if self._head_bytes > MAX_HEAD_BYTES:
            return  # refused already: dropped unread until the answer in progress is out
        self._head_bytes += len(data)
        super().data_received(data)
        if self._head_bytes > MAX_HEAD_BYTES and not self._head_read:
            # refused as it passes the limit (a head that ends in the read that passed it
            # is served: at most one read more), after the answer in progress if any (its
            # bytes are read meanwhile: a close with bytes unread would reset the
            # connection, and the answers not yet sent would be lost)
            cycle = self.cycle
            if (cycle is None or cycle.response_complete) and not self.transport.is_closing():
                log.info("refusing a request head over %d bytes", MAX_HEAD_BYTES)
                self._drop(_HEAD_TOO_LARGE)

    def on_body(self, body: bytes) -> None:
        self._received += len(body)
        super().on_body(body)

    def _start_data(self, data_apps: DataApps) -> bool:
        """Start a request to a data route straight at its route: uvicorn's
        ``on_headers_complete`` with an :class:`Answering` cycle and the route for
        the app (the app's own router would find the same). False: not a data route
        (a POST to another path, a path with escapes, a root path, an upgrade)."""
        parser = self.parser
        if parser.get_method() != b"POST" or self.root_path or parser.should_upgrade():
            return False
        url = self.url
        if len(url) > _URL_PARSED_MAX or not url.startswith(b"/") or b"#" in url:
            return False  # an absolute form, a fragment, or too long: as uvicorn parses it
        raw_path, _, query = url.partition(b"?")  # (httptools' parse_url, for this form)
        path = raw_path.decode("ascii")
        if "%" in path:
            return False
        app = data_apps(path)
        if app is None:
            return False
        scope: Any = self.scope
        http_version = parser.get_http_version()
        scope["method"] = "POST"
        if http_version != "1.1":
            scope["http_version"] = http_version
        scope["path"] = path
        scope["raw_path"] = raw_path
        scope["query_string"] = query
        existing = self.cycle
        self.cycle = cycle = Answering(
            scope=scope,
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=self.expect_100_continue,
            keep_alive=http_version != "1.0" and parser.should_keep_alive(),
            on_response=self.on_response_complete,
        )
        if existing is None or existing.response_complete:
            # started when this read is parsed: with no task of its own when all of its
            # body came with it (``data.serve_now``), else as uvicorn starts a request
            self._ready = (cycle, app)
        else:  # pipelined: after the one before
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, app))
        return True

    def shutdown(self) -> None:
        """The server stops (uvicorn closes idle connections at once). A connection
        accepted whose first request has not been read yet was opened to send one:
        it gets ``FIRST_REQUEST_GRACE_S`` to arrive and be answered."""
        if self.cycle is None and not self.transport.is_closing():
            self._closing_at = self.loop.time() + FIRST_REQUEST_GRACE_S
            if self.sweeping[0] is None:
                self._schedule_sweep()
            return
        super().shutdown()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = OneWrite(transport, self.loop, self.flushing)  # type: ignore[assignment]
        self._since = self.loop.time()  # in its current state (idle, or busy) since
        self._order = next(_ORDER)
        self._closing_at = None  # the server stops: close when idle past it
        self._received = 0  # body bytes received on this connection, in all
        self._upload = Meter()  # the pace of the body being received
        self._download = Meter()  # the pace at which the client takes an unsent answer
        self._sending = False  # an answer waits in the write buffer (seen by the sweep)
        self._leaving = False  # closed here: it is on its way out
        if len(self.connections) > self.limits.max_connections and not self._evict_one():
            log.warning("refusing a connection: %d open, all busy", len(self.connections) - 1)
            transport.write(_BUSY)
            transport.close()
            return
        if self.sweeping[0] is None:
            self._schedule_sweep()

    # --- the cap -----------------------------------------------------------------------

    def _evict_one(self) -> bool:
        """Close the worst offender (not this one); False when every other connection
        has a request in progress at a good pace."""
        pace = self.limits.pace
        worst: GuardedProtocol | None = None
        worst_rank: tuple[int, float, int] | None = None
        for c in self.connections:
            if c is self or not isinstance(c, GuardedProtocol) or c._leaving:
                continue
            rank = c._eviction_rank(pace)
            if rank is not None and (worst_rank is None or rank < worst_rank):
                worst, worst_rank = c, rank
        if worst is None or worst_rank is None:
            return False
        worst._evict(worst_rank, pace)
        return True

    def _eviction_rank(self, pace: Pace) -> tuple[int, float, int] | None:
        """Where this connection stands in the order of eviction, first lowest: one
        closing already (its flush stuck), the slowest transfer under the minimum
        rate, the longest without a request, the longest kept alive between requests.
        None: a request in progress at a good pace, never evicted."""
        if self.transport.is_closing():
            return (0, 0.0, self._order)
        if self._sending and (rate := self._download.slow_rate(self._taken(), pace)) is not None:
            return (1, rate, self._order)
        cycle = self.cycle
        if cycle is None:
            return (2, self._since, self._order)
        if cycle.response_complete:
            return (3, self._since, self._order)
        if self._awaiting_body(cycle):
            rate = self._upload.slow_rate(self._received, pace)
            if rate is not None:
                return (1, rate, self._order)
        return None

    def _evict(self, rank: tuple[int, float, int], pace: Pace) -> None:
        kind, rate, _ = rank
        if kind == 1 and not self._sending:  # a body too slow: the client is told why
            log.info("closing a connection at the cap: a body at %.1f bytes/s", rate)
            error = BodyTooSlow(rate, pace.min_rate_bytes_s, self._upload.waited_s)
            self._refuse(error, "; its connection was closed for another at the connection cap")
        else:
            self._drop()

    # --- deadlines and rates -----------------------------------------------------------

    def _taken(self) -> int:
        """Bytes of answers the client has taken (written, less those still unsent)."""
        transport: Any = self.transport
        return int(transport.written) - int(transport.get_write_buffer_size())

    def _awaiting_body(self, cycle: Any) -> bool:
        """The request's body is incomplete and the client, not the server, holds it up:
        not paused by flow control (the application has not asked for more), nor
        waiting for ``100 Continue``."""
        return bool(
            cycle.more_body and not self.flow.read_paused and not cycle.waiting_for_100_continue
        )

    def _drop(self, answer: bytes | None = None) -> None:
        """Close, after ``answer`` unless one is being written; at once when what is
        written cannot leave (the client does not read): a close would wait on it."""
        self._leaving = True
        transport = self.transport
        cycle = self.cycle
        answering = cycle is not None and cycle.response_started and not cycle.response_complete
        if answer is not None and not answering:
            transport.write(answer)
        transport.close()  # writes what is pending first
        if transport.get_write_buffer_size():
            transport.abort()

    def _refuse(self, error: BodyTooSlow, more: str = "") -> None:
        """Answer a body too slow 408 and close; the application reading it sees why."""
        cycle = self.cycle
        if cycle is not None:
            cycle.keep_alive = False
            cycle.refused = error  # type: ignore[attr-defined]  # read_body raises it
        self._drop(_closing_answer("408 Request Timeout", error.message + more))

    def _schedule_sweep(self) -> None:
        self.sweeping[0] = self.loop.call_later(SWEEP_S, self._sweep)

    def _sweep(self) -> None:
        """Close the connections past a deadline or under the minimum rate; again in
        ``SWEEP_S`` while any is open."""
        self.sweeping[0] = None
        now = self.loop.time()
        waited = min(now - self.swept_at[0], MAX_SWEEP_GAP_S)
        self.swept_at[0] = now
        pace = self.limits.pace
        for connection in list(self.connections):
            if isinstance(connection, GuardedProtocol) and not connection._leaving:
                connection._check(now, waited, pace)
        if self.connections:
            self._schedule_sweep()

    def _check(self, now: float, waited: float, pace: Pace) -> None:
        transport = self.transport
        if transport.get_write_buffer_size():  # an answer the client has not taken yet
            taken = self._taken()
            if not self._sending:
                self._sending = True
                self._download.restart(taken)
            elif pace.on and (rate := self._download.wait(taken, waited, pace)) is not None:
                log.info("closing a connection: its answer taken at %.1f bytes/s", rate)
                self._leaving = True
                transport.abort()  # nothing more can reach a client that does not read
                return
        else:
            self._sending = False
        if transport.is_closing():
            return
        cycle = self.cycle
        stopping = self._closing_at is not None and now >= self._closing_at
        if stopping and (cycle is None or cycle.response_complete):
            self._drop()
            return
        if cycle is not None and not cycle.response_complete:  # a request in progress
            self._state, self._since = cycle, now
            if pace.on and self._awaiting_body(cycle):
                rate = self._upload.wait(self._received, waited, pace)
                if rate is not None:
                    log.info("closing a connection: a body at %.1f bytes/s", rate)
                    self._refuse(BodyTooSlow(rate, pace.min_rate_bytes_s, pace.window_s))
            return
        if cycle is not self._state:  # a request completed since the last look
            self._state, self._since = cycle, now
            return
        if (
            cycle is not None
            and self._head_read  # no byte of the next request yet: idle, kept alive
            and now - self._since >= self.timeout_keep_alive
        ):
            self._leaving = True
            transport.close()  # as uvicorn's keep-alive timer closes it: no answer
            return
        if now - self._since >= self.limits.header_timeout_s:
            log.info("closing a connection: no request within %ss", self.limits.header_timeout_s)
            self._drop(_HEAD_TIMEOUT)


def guarded_protocol(
    limits: ConnectionLimits, lifecycle: Lifecycle | None = None, data_apps: DataApps | None = None
) -> type[GuardedProtocol]:
    """A :class:`GuardedProtocol` class for one server's limits and node (and its data
    routes, answered without the ASGI app's own dispatch)."""
    return type(
        "FnrtHttpProtocol",
        (GuardedProtocol,),
        {
            "limits": limits,
            "lifecycle": lifecycle,
            "data_apps": staticmethod(data_apps) if data_apps is not None else None,
            "sweeping": [None],
            "swept_at": [0.0],
            "flushing": [],
        },
    )


def close_after_answer(connections: Iterable[object]) -> None:
    """Requests in progress on ``connections`` answer with ``Connection: close``."""
    for connection in connections:
        cycle = getattr(connection, "cycle", None)
        if cycle is not None and not cycle.response_started:
            cycle.keep_alive = False
