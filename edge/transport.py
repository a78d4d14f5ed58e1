"""How the edge client talks HTTP: the standard library only, one kept-alive connection.

:class:`Throttled` wraps a transport to emulate a slower link (a bandwidth
and a round-trip time), for trying plans on a fast network and for tests.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]  # names in lower case
    body: bytes


class Transport(Protocol):
    def request(
        self, method: str, path: str, body: bytes | None, headers: Mapping[str, str]
    ) -> Response:
        """Send one request to the server; OSError when it cannot be reached."""
        ...


class HttpTransport:
    """HTTP/1.1 to one server (``http://host:port``), the connection kept between calls;
    ``key`` (a function's invoke key) goes with every request as ``Authorization:
    Bearer``."""

    def __init__(self, server: str, timeout_s: float = 30.0, key: str | None = None) -> None:
        parts = urlsplit(server)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"server must be an http(s):// URL, got {server!r}")
        self.server = server.rstrip("/")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._timeout_s = timeout_s
        self._authorization = {"authorization": f"Bearer {key}"} if key else {}
        self._connection: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def _connect(self) -> http.client.HTTPConnection:
        if self._connection is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._connection = cls(self._host, self._port, timeout=self._timeout_s)
        return self._connection

    def request(
        self, method: str, path: str, body: bytes | None, headers: Mapping[str, str]
    ) -> Response:
        with self._lock:
            for attempt in (0, 1):  # a kept-alive connection the server closed: once more
                connection = self._connect()
                try:
                    sent = {**headers, **self._authorization}
                    connection.request(method, self._prefix + path, body, sent)
                    answer = connection.getresponse()
                    data = answer.read()
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                    self.close()
                    if attempt:
                        raise
                    continue
                except (OSError, http.client.HTTPException):
                    self.close()
                    raise
                return Response(answer.status, {k.lower(): v for k, v in answer.getheaders()}, data)
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class Throttled:
    """A transport behind an emulated link: each request takes ``rtt_ms`` plus its
    bytes (both ways) at ``bandwidth_bytes_per_s`` longer than it would."""

    def __init__(
        self,
        inner: Transport,
        bandwidth_bytes_per_s: float,
        rtt_ms: float,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not bandwidth_bytes_per_s > 0 or not rtt_ms >= 0:
            raise ValueError("bandwidth_bytes_per_s must be > 0 and rtt_ms >= 0")
        self.inner = inner
        self.bandwidth_bytes_per_s = bandwidth_bytes_per_s
        self.rtt_ms = rtt_ms
        self._sleep = sleep

    def request(
        self, method: str, path: str, body: bytes | None, headers: Mapping[str, str]
    ) -> Response:
        sent = len(body or b"")
        self._sleep(self.rtt_ms / 2000.0 + sent / self.bandwidth_bytes_per_s)  # there
        response = self.inner.request(method, path, body, headers)
        self._sleep(self.rtt_ms / 2000.0 + len(response.body) / self.bandwidth_bytes_per_s)
        return response
