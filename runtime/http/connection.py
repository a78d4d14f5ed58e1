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
request that arrives whole in one read, the usual case, arms no timer.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections import OrderedDict
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


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with read deadlines and an evicting connection cap.

    Subclassed per server by :func:`guarded_protocol`, which sets ``limits`` and
    the server's shared table of idle connections (oldest first)."""

    limits: ConnectionLimits = ConnectionLimits()
    idle: OrderedDict[GuardedProtocol, None] = OrderedDict()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._began_at = 0.0  # loop time the current request (or the connection) began
        self._last_read_at = 0.0
        self._in_head = True  # a fresh connection waits for its first request head
        self._in_body = False
        self._timer: asyncio.TimerHandle | None = None

    # --- the connection ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections and not self._evict_one():
            log.warning("refusing a connection: %d open, all busy", len(self.connections) - 1)
            transport.write(_BUSY)
            transport.close()
            return
        self._began_at = self._last_read_at = self.loop.time()
        self.idle[self] = None
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self.idle.pop(self, None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

    def _evict_one(self) -> bool:
        """Close the connection idle longest (not this one); False when none is idle."""
        for other in self.idle:
            if other is not self:
                del self.idle[other]
                other.transport.close()
                return True
        return False

    # --- reading -----------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self._last_read_at = self.loop.time()
        super().data_received(data)
        if (self._in_head or self._in_body) and self._timer is None:
            self._arm()  # a request left half read: it gets a deadline

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._began_at = self._last_read_at
        self._in_head = True

    def on_headers_complete(self) -> None:
        self._in_head, self._in_body = False, True
        self.idle.pop(self, None)  # a request in progress: not to be evicted
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_body = False
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self.idle[self] = None  # kept alive: idle again, newest last

    # --- deadlines ---------------------------------------------------------------------

    def _deadline(self) -> float | None:
        if self._in_head:
            return self._began_at + self.limits.header_timeout_s
        if self._in_body:
            return self._last_read_at + self.limits.body_timeout_s
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
        if self._in_head:
            if self.cycle is None or self.cycle.response_complete:
                self.transport.write(_HEAD_TIMEOUT)
            log.info(
                "closing a connection: no request head within %ss", self.limits.header_timeout_s
            )
        else:
            log.info("closing a connection: its body stalled for %ss", self.limits.body_timeout_s)
        self.transport.close()


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedProtocol]:
    """A :class:`GuardedProtocol` class for one server: its limits, its idle table."""
    return type(
        "FnrtHttpProtocol",
        (GuardedProtocol,),
        {"limits": limits, "idle": OrderedDict()},
    )
