"""The control socket between the server and a worker process: msgpack messages,
each framed by its length. Tensor data never travels here (see ``arena.py``).

The worker reads and writes it blocking. The server sends blocking too (a
message is small and the worker has read the last one before it answered),
and waits for a batch's reply on its event loop, so a batch costs no thread
hop: :meth:`Channel.read_soon` reads it in the loop's reader callback (no task,
no read tried before the socket is readable), :meth:`Channel.receive` in a
coroutine. The socket stays registered with the loop between batches (each
``add_reader`` makes uvloop a new poll handle: about eight system calls a batch),
until it turns readable with nothing awaiting it (the worker ended, or a thread
reads it blocking) or the channel closes; a channel closed from another thread
leaves the loop first, on the loop, so no stale handle outlives its descriptor.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import msgpack

_HEADER = struct.Struct("<I")

#: The most a read-ahead :meth:`Channel.recv` asks the socket for at once.
READ_AHEAD_BYTES = 1 << 16


class ChannelClosed(Exception):
    """The other end closed the socket (it exited or was killed)."""


#: What :meth:`Channel.read_soon` delivers: the message, or why none can come.
Received = dict[str, Any] | ChannelClosed


def _delivered(message: Received) -> None:
    """What a reader delivers to once it has delivered (never called: it reads once)."""


def _stopped() -> None:
    """What a reader stops with once it has delivered (stopped already)."""


class Channel:
    """One end of a connected socket pair, carrying one message at a time."""

    def __init__(self, sock: socket.socket, *, read_ahead: bool = False) -> None:
        """``read_ahead``: :meth:`recv` reads whatever the socket holds, up to
        :data:`READ_AHEAD_BYTES`, and keeps what is past the message for the next one
        (a worker: a message's header and body in one ``recv``, not two). Only for an
        end whose every read is :meth:`recv`."""
        self._sock = sock
        self._ahead: bytearray | None = bytearray() if read_ahead else None
        self._fd = sock.fileno()
        # the loop the socket is registered with for reading, and who reads when it
        # turns readable (None: nobody now, so the next readiness unregisters it)
        self._watched_by: asyncio.AbstractEventLoop | None = None
        self._on_readable: Callable[[], None] | None = None
        self._closed = False

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

    async def receive(self, timeout_s: float | None = None) -> dict[str, Any]:
        """The next message, waited for on the running event loop; TimeoutError when
        ``timeout_s`` passes first, ChannelClosed when the other end is gone. A
        cancelled wait leaves the rest of that message unread: nothing may read
        this channel after it (its instance is given up)."""
        async with asyncio.timeout(timeout_s):
            (length,) = _HEADER.unpack(await self._read_soon(_HEADER.size))
            body = await self._read_soon(length)
        message: dict[str, Any] = msgpack.unpackb(body, raw=False, strict_map_key=False)
        return message

    async def _read_soon(self, count: int) -> bytes:
        """``count`` bytes, read without blocking whenever the loop finds the socket readable."""
        chunks = bytearray()
        while len(chunks) < count:
            try:
                chunk = self._sock.recv(count - len(chunks), socket.MSG_DONTWAIT)
            except BlockingIOError:
                await self._readable()
                continue
            except OSError as exc:
                raise ChannelClosed(str(exc)) from None
            if not chunk:
                raise ChannelClosed("the other end closed the connection")
            chunks += chunk
        return bytes(chunks)

    async def _readable(self) -> None:
        loop = asyncio.get_running_loop()
        ready = loop.create_future()

        def readable() -> None:  # the loop may call it again before the waiter runs
            if not ready.done():
                ready.set_result(None)

        self._watch(loop, readable)
        try:
            await ready
        finally:
            self._on_readable = None

    def _watch(self, loop: asyncio.AbstractEventLoop, on_readable: Callable[[], None]) -> None:
        """Have ``on_readable`` called when the socket is readable, registering it with
        ``loop`` unless it still is."""
        if self._closed:
            raise ChannelClosed("the channel is closed")
        self._on_readable = on_readable
        if self._watched_by is not loop:
            if self._watched_by is not None:
                self._unwatch()
            loop.add_reader(self._fd, self._readable_now)
            self._watched_by = loop

    def _readable_now(self) -> None:
        on_readable = self._on_readable
        if on_readable is None:  # nothing awaits it: leave the data, stop watching
            self._unwatch()
            return
        on_readable()

    def _unwatch(self) -> None:
        loop, self._watched_by = self._watched_by, None
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self._fd)

    def read_soon(
        self, loop: asyncio.AbstractEventLoop, deliver: Callable[[Received], None]
    ) -> Callable[[], None]:
        """Read the next message as the loop finds the socket readable, with no task and
        no read tried before then: ``deliver`` gets it (or ChannelClosed), called from
        the loop's reader callback. Exactly one message is read (the reply to a batch
        sent after it stays in the socket). The function returned stops reading
        (a wait given up or timed out); it may be called more than once."""
        sock = self._sock
        buffer = bytearray()
        length = -1  # the body's length, once the header is read

        def stop() -> None:
            if self._on_readable is readable:
                self._on_readable = None  # still registered: the next batch's read reuses it

        def readable() -> None:
            nonlocal length, deliver, stop
            try:
                while True:
                    want = (_HEADER.size if length < 0 else length) - len(buffer)
                    chunk = sock.recv(want, socket.MSG_DONTWAIT)
                    if not chunk:
                        raise ChannelClosed("the other end closed the connection")
                    buffer.extend(chunk)
                    if len(chunk) < want:
                        continue  # the rest is on its way (or in the socket already)
                    if length < 0:
                        (length,) = _HEADER.unpack(buffer)
                        buffer.clear()
                        continue
                    break
                message: Received = msgpack.unpackb(buffer, raw=False, strict_map_key=False)
            except BlockingIOError:
                return  # the rest of it comes later
            except ChannelClosed as exc:
                message = exc
            except (OSError, ValueError) as exc:  # ValueError: msgpack's unreadable body
                message = ChannelClosed(str(exc))
            stop()
            # delivered once: this reader (which ``stop`` and the loop's registration
            # may outlive) holds neither the reply nor its instance after it, nor
            # ``stop``, which holds it (a cycle a batch, left to the garbage collector)
            delivered, deliver, stop = deliver, _delivered, _stopped
            delivered(message)

        try:
            self._watch(loop, readable)
        except ChannelClosed as exc:
            loop.call_soon(deliver, exc)
        return stop

    def _read(self, count: int, deadline: float | None) -> bytes:
        ahead = self._ahead
        if ahead is not None:
            while len(ahead) < count:
                ahead += self._recv_some(max(count - len(ahead), READ_AHEAD_BYTES), deadline)
            data = bytes(ahead[:count])
            del ahead[:count]
            return data
        chunks = bytearray()
        while len(chunks) < count:
            chunks += self._recv_some(count - len(chunks), deadline)
        return bytes(chunks)

    def _recv_some(self, most: int, deadline: float | None) -> bytes:
        """One ``recv`` of at most ``most`` bytes (at least one) before ``deadline``."""
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self._sock.settimeout(left)
        try:
            chunk = self._sock.recv(most)
        except TimeoutError:
            raise
        except OSError as exc:
            raise ChannelClosed(str(exc)) from None
        finally:
            if deadline is not None:
                self._sock.settimeout(None)
        if not chunk:
            raise ChannelClosed("the other end closed the connection")
        return chunk

    def close(self) -> None:
        """Close the socket, from any thread: one still registered with a running loop
        on another thread leaves it first, on that loop."""
        self._closed = True
        self._on_readable = None
        loop = self._watched_by
        if loop is None or loop.is_closed():
            self._sock.close()
            return
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:
            self._close_on_loop()
            return
        try:
            loop.call_soon_threadsafe(self._close_on_loop)
        except RuntimeError:  # the loop closed meanwhile
            self._sock.close()

    def _close_on_loop(self) -> None:
        self._unwatch()
        self._sock.close()
