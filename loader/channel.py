"""The control socket between the server and a worker process: msgpack messages,
each framed by its length. Tensor data never travels here (see ``arena.py``)."""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

import msgpack

_HEADER = struct.Struct("<I")


class ChannelClosed(Exception):
    """The other end closed the socket (it exited or was killed)."""


class Channel:
    """One end of a connected socket pair, carrying one message at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def send(self, message: dict[str, Any]) -> None:
        data = msgpack.packb(message, use_bin_type=True)
        try:
            self._sock.sendall(_HEADER.pack(len(data)) + data)
        except OSError as exc:  # EPIPE, ECONNRESET: the worker is gone
            raise ChannelClosed(str(exc)) from None

    def recv(self, timeout_s: float | None = None) -> dict[str, Any]:
        """The next message; TimeoutError when ``timeout_s`` passes first, ChannelClosed
        when the other end is gone."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        (length,) = _HEADER.unpack(self._read(_HEADER.size, deadline))
        message: dict[str, Any] = msgpack.unpackb(
            self._read(length, deadline), raw=False, strict_map_key=False
        )
        return message

    def _read(self, count: int, deadline: float | None) -> bytes:
        chunks = bytearray()
        while len(chunks) < count:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                self._sock.settimeout(left)
            try:
                chunk = self._sock.recv(count - len(chunks))
            except TimeoutError:
                raise
            except OSError as exc:
                raise ChannelClosed(str(exc)) from None
            finally:
                if deadline is not None:
                    self._sock.settimeout(None)
            if not chunk:
                raise ChannelClosed("the other end closed the connection")
            chunks += chunk
        return bytes(chunks)

    def close(self) -> None:
        self._sock.close()
