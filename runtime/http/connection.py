"""Connections that cannot hold the node: read deadlines and a cap that evicts idle ones.

uvicorn times out idle keep-alive connections, but a connection that sends its
request head a byte at a time (slowloris), or never sends one, is held
forever; and every held connection is a file descriptor. 1,100 of them
against a limit of 1,024 left none for the store: 39 of 40 normal requests
failed. :class:`GuardedProtocol` is uvicorn's httptools protocol with:

- a deadline for the request head, from its first byte (or from the
  connection, for the first request): ``header_timeout_s``, answered 408;
- a deadline between reads of a body: ``body_timeout_s``, the connection
  closed (the handler's read sees the client gone, 499);
- a cap on open connections. At the cap a new connection closes the one idle
  longest (fresh, reading a head, or kept alive between requests); only when
  every connection has a request in progress is the new one refused (503).

The cap sits below the process's descriptor limit by a reserve for the
store, the disk cache and worker processes (:func:`connection_cap`). A
request that arrives whole in one read, the usual case, arms no timer, and
only ``data_received`` runs in Python per request.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import resource
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

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


_BUSY_BODY = b'{"error": "the server has as many connections as it allows, all busy; retry later"}'
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: "
    + str(len(_BUSY_BODY)).encode()
    + b"\r\n\r\n"
    + _BUSY_BODY
)
_HEAD_TIMEOUT_BODY = b'{"error": "the request head did not arrive in time"}'
_HEAD_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: "
    + str(len(_HEAD_TIMEOUT_BODY)).encode()
    + b"\r\n\r\n"
    + _HEAD_TIMEOUT_BODY
)


_SEEN = itertools.count()  # orders connections by when they were last seen


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with read deadlines and an evicting connection cap.

    Subclassed per server by :func:`guarded_protocol`, which sets ``limits``. Only
    ``data_received`` runs per request (the hot path): whether a head or a body is
    half read is told from uvicorn's own request cycle, and the idle connection to
    evict is looked for only at the cap."""

    limits: ConnectionLimits = ConnectionLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last_seen = 0.0  # loop time of the last read (or of the connection)
        self._order = 0  # its place among connections made in the same loop tick
        self._head_since: float | None = None  # a request head began arriving then
        self._timer: asyncio.TimerHandle | None = None

    # --- the connection ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections and not self._evict_one():
            log.warning("refusing a connection: %d open, all busy", len(self.connections) - 1)
            transport.write(_BUSY)
            transport.close()
            return
        self._last_seen = self._head_since = self.loop.time()  # its first head is due
        self._order = next(_SEEN)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

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
        oldest = min(idle, key=lambda c: (c._last_seen, c._order))
        oldest.transport.close()
        return True

    # --- reading -----------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._last_seen = self.loop.time()
        before = self.cycle
        super().data_received(data)
        cycle = self.cycle
        if cycle is not before:  # a request head completed in this read: the usual case
            self._head_since = None
            if cycle.more_body and self._timer is None:
                self._arm()  # its body is still to come: it gets a deadline
        elif self._timer is None:  # a head (or a body) still arriving
            self._partial_read(cycle)

    def _partial_read(self, cycle: Any) -> None:
        if self._head_since is None and (cycle is None or cycle.response_complete):
            self._head_since = self._last_seen  # between requests: a head began
        self._arm()

    # --- deadlines ---------------------------------------------------------------------

    def _deadline(self) -> float | None:
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if cycle.more_body:  # its body is still arriving
                return self._last_seen + self.limits.body_timeout_s
            return None  # read whole: being answered
        if self._head_since is not None:
            return self._head_since + self.limits.header_timeout_s
        return None

    def _arm(self) -> None:
        deadline = self._deadline()
        if deadline is not None:
            self._timer = self.loop.call_at(deadline, self._check)

    def _check(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        deadline = self._deadline()
        if deadline is None:  # the request was read in time
            return
        if self.loop.time() < deadline:  # it moved on since: wait for the rest
            self._timer = self.loop.call_at(deadline, self._check)
            return
        if self._idle:
            self.transport.write(_HEAD_TIMEOUT)
            log.info(
                "closing a connection: no request head within %ss", self.limits.header_timeout_s
            )
        else:
            log.info("closing a connection: its body stalled for %ss", self.limits.body_timeout_s)
        self.transport.close()


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedProtocol]:
    """A :class:`GuardedProtocol` class for one server's limits."""
    return type("FnrtHttpProtocol", (GuardedProtocol,), {"limits": limits})
