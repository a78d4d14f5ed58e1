"""Connections that cannot hold the node: read deadlines and a cap that evicts idle ones.

uvicorn times out idle keep-alive connections, but a connection that sends its
request head a byte at a time (slowloris), or never sends one, is held
forever; and every held connection is a file descriptor. 1,100 of them
against a limit of 1,024 left none for the store: 39 of 40 normal requests
failed. :class:`GuardedProtocol` is uvicorn's httptools protocol with:

- a deadline for a request: a connection with none in progress (fresh, sending
  a head, or idle between requests) for ``header_timeout_s`` is answered 408
  and closed. A head dribbled a byte at a time never completes, so it is cut
  off however it trickles;
- a cap on open connections. At the cap a new connection closes the one idle
  longest; only when every connection has a request in progress is the new
  one refused (503).

A request's body has a deadline between reads too, ``body_timeout_s``, kept
by ``body.read_body`` (a request read whole in one go, the usual case, waits
on no timer). The cap sits below the process's descriptor limit by a reserve
for the store, the disk cache and worker processes (:func:`connection_cap`).
Nothing here runs per request: a sweep every ``SWEEP_S`` checks the deadlines.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import resource
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from fnrt.runtime.lifecycle import Lifecycle

log = logging.getLogger("fnrt.http")


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 1024

    def __post_init__(self) -> None:
        if self.header_timeout_s <= 0 or self.body_timeout_s <= 0:
            raise ValueError("header_timeout_s and body_timeout_s: must be > 0")
        if self.max_connections < 1:
            raise ValueError("max_connections: must be at least 1")


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
    """

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] | None = None

    def write(self, data: bytes) -> None:
        if self._pending is None:
            self._pending = [data]
            self._loop.call_soon(self._flush)
        else:
            self._pending.append(data)

    def _flush(self) -> None:
        pending, self._pending = self._pending, None
        if pending and not self._transport.is_closing():
            self._transport.writelines(pending)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


#: When the server stops, how long a connection accepted but not yet read may still
#: send its first request (it was opened to send one).
FIRST_REQUEST_GRACE_S = 0.5


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a request deadline and an evicting connection cap.

    Subclassed per server by :func:`guarded_protocol`, which sets ``limits`` and
    the node's ``lifecycle``. Per request it only looks whether the node is
    draining (then the answer says ``Connection: close``, so the client goes
    elsewhere next time); a sweep (one timer for the server, every ``SWEEP_S``)
    reads each connection's state from uvicorn's own request cycle, and the idle
    connection to evict is looked for only at the cap."""

    limits: ConnectionLimits = ConnectionLimits()
    lifecycle: Lifecycle | None = None
    _closing_at: float | None = None  # the server stops: close when idle past this time
    sweeping: list[asyncio.TimerHandle | None] = [None]  # the server's sweep timer

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        lifecycle = self.lifecycle
        if self.cycle is not None and (
            (lifecycle is not None and lifecycle.draining) or self._closing_at is not None
        ):
            self.cycle.keep_alive = False  # this answer closes the connection

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
        self.transport = OneWrite(transport, self.loop)  # type: ignore[assignment]
        self._since = self.loop.time()  # in its current state (idle, or busy) since
        self._state: object = None  # the request cycle the sweep saw last
        self._order = next(_ORDER)
        self._closing_at = None  # the server stops: close when idle past it
        if len(self.connections) > self.limits.max_connections and not self._evict_one():
            log.warning("refusing a connection: %d open, all busy", len(self.connections) - 1)
            transport.write(_BUSY)
            transport.close()
            return
        if self.sweeping[0] is None:
            self._schedule_sweep()

    # --- the cap -----------------------------------------------------------------------

    @property
    def _idle(self) -> bool:
        """No request in progress: fresh, sending a head, or kept alive between requests."""
        cycle = self.cycle
        return cycle is None or cycle.response_complete

    def _evict_one(self) -> bool:
        """Close the connection idle longest (not this one); False when none is idle."""
        idle = [
            c
            for c in self.connections
            if c is not self and isinstance(c, GuardedProtocol) and c._idle
        ]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: (c._since, c._order))
        oldest.transport.close()
        return True

    # --- deadlines ---------------------------------------------------------------------

    def _schedule_sweep(self) -> None:
        self.sweeping[0] = self.loop.call_later(SWEEP_S, self._sweep)

    def _sweep(self) -> None:
        """Close the connections past a deadline; again in ``SWEEP_S`` while any is open."""
        self.sweeping[0] = None
        now = self.loop.time()
        for connection in list(self.connections):
            if isinstance(connection, GuardedProtocol):
                connection._check(now)
        if self.connections:
            self._schedule_sweep()

    def _check(self, now: float) -> None:
        if self.transport.is_closing():
            return
        cycle = self.cycle
        stopping = self._closing_at is not None and now >= self._closing_at
        if stopping and (cycle is None or cycle.response_complete):
            self.transport.close()
            return
        if cycle is not None and not cycle.response_complete:  # a request in progress
            self._state, self._since = cycle, now  # (its body has read_body's deadline)
            return
        if cycle is not self._state:  # a request completed since the last look
            self._state, self._since = cycle, now
            return
        if now - self._since >= self.limits.header_timeout_s:
            self.transport.write(_HEAD_TIMEOUT)
            log.info("closing a connection: no request within %ss", self.limits.header_timeout_s)
            self.transport.close()


def guarded_protocol(
    limits: ConnectionLimits, lifecycle: Lifecycle | None = None
) -> type[GuardedProtocol]:
    """A :class:`GuardedProtocol` class for one server's limits and node."""
    return type(
        "FnrtHttpProtocol",
        (GuardedProtocol,),
        {"limits": limits, "lifecycle": lifecycle, "sweeping": [None]},
    )


def close_after_answer(connections: Iterable[object]) -> None:
    """Requests in progress on ``connections`` answer with ``Connection: close``."""
    for connection in connections:
        cycle = getattr(connection, "cycle", None)
        if cycle is not None and not cycle.response_started:
            cycle.keep_alive = False
