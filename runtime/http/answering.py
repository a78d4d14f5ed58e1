"""How a connection writes: an answer whole, with the turn's other answers.

:class:`OneWrite` holds a connection's writes until the end of the event loop's
turn, so an answer's head and body leave in one ``writev``. :class:`Answering`
is uvicorn's request cycle for the data routes, which read one whole body and
send one whole answer (``connection.GuardedProtocol`` makes it for them);
:func:`header_lines` encodes an answer's headers once, as uvicorn checks them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from uvicorn.protocols.http.httptools_impl import (
    HEADER_VALUE_RE,
    STATUS_LINE,
    RequestResponseCycle,
)

__all__ = ["Answering", "OneWrite", "header_lines"]


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

    __slots__ = ("_loop", "_pending", "_transport", "written")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] | None = None
        self.written = 0  # bytes written in all: the sweep measures how fast they leave

    def write(self, data: bytes) -> None:
        self.written += len(data)
        if self._pending is None:
            self._pending = [data]
            self._loop.call_soon(self._flush)
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
