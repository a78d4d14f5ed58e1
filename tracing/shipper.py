"""OTLP export from a process of its own, so encoding spans never takes the server's GIL.

Encoding a span as OTLP protobuf is a few µs of Python; a traced invoke makes
three or four, and in the server that time would be taken under the GIL the
event loop needs. So the server's exporter (:class:`ShippedExporter`) writes
the spans, which a tracer hands over flat (tuples of builtins,
:data:`fnrt.tracing.recorder.Flat`), to a child process's stdin as ``marshal``
frames of ``FRAME_SPANS``; the child (``python -m fnrt.tracing.shipper``)
encodes them and posts them to the collector
(:class:`fnrt.tracing.export.OtlpHttpExporter`), the frames already waiting in
one request.

The child ignores SIGINT (a Ctrl-C reaches the whole process group; the
server's shutdown is what ends it) and exits when its stdin closes, after
exporting what it read. A child that dies is started again, at most once per
``restart_interval_s``; what could not be handed over meanwhile is dropped
and counted, like spans over the batch exporter's queue.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import marshal
import math
import os
import select
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fnrt.tracing.export import OtlpHttpExporter, traces_url
from fnrt.tracing.otlp import plain
from fnrt.tracing.recorder import Flat

log = logging.getLogger("fnrt.tracing")

_LENGTH = struct.Struct("<I")
#: The pipe's buffer (Linux lets a pipe grow to 1 MiB unprivileged): a second of spans
#: at thousands of requests a second, so a collector's hiccup does not stall the
#: exporting thread.
PIPE_BYTES = 1 << 20
#: Spans in one frame (about 0.3 ms of ``marshal`` holding the GIL).
FRAME_SPANS = 256
#: Spans the shipper posts at most in one request: the frames waiting, together.
POST_SPANS = 4096
#: How long the shipper holds the spans it read for more frames before it posts them
#: (the export thread writes a frame every 50 ms under load): a post costs the shipper
#: and the collector about as much as encoding a hundred spans, so at thousands of
#: requests a second one post per half second rather than one per frame.
POST_HOLD_S = 0.5


class ShippedExporter:
    """A :class:`fnrt.tracing.export.SpanExporter` that hands batches to a shipper process."""

    def __init__(
        self,
        endpoint: str,
        resource: Mapping[str, Any],
        *,
        timeout_s: float = 10.0,
        restart_interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        endpoint = traces_url(endpoint)  # a bad one is refused here, not in the child
        self.command = [
            sys.executable,
            "-m",
            "fnrt.tracing.shipper",
            endpoint,
            json.dumps(dict(resource)),
            str(timeout_s),
        ]
        self.restart_interval_s = restart_interval_s
        self.dropped = 0  # spans that could not be handed to a shipper
        self.starts = 0
        self._clock = clock
        self._started_at = float("-inf")
        self._process: subprocess.Popen[bytes] | None = None
        self._start()

    def _start(self) -> None:
        self._started_at = self._clock()
        self.starts += 1
        # stderr is the server's: the shipper's warnings (a collector down) go with its own
        process = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        assert process.stdin is not None
        with contextlib.suppress(OSError, AttributeError):  # not Linux, or a lower limit
            fcntl.fcntl(process.stdin.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        self._process = process

    def _live(self) -> subprocess.Popen[bytes] | None:
        """The shipper, started again if it died and the restart interval has passed."""
        process = self._process
        if process is not None and process.poll() is None:
            return process
        if process is not None:
            log.warning(
                "the span shipper exited with %s; spans are dropped until it restarts",
                process.returncode,
            )
            with contextlib.suppress(OSError):
                if process.stdin is not None:
                    process.stdin.close()
            self._process = None
        if self._clock() - self._started_at < self.restart_interval_s:
            return None
        self._start()
        return self._process

    def export(self, spans: Sequence[Flat]) -> None:
        """Hand ``spans`` to the shipper, ``FRAME_SPANS`` to a frame: ``marshal`` holds
        the GIL while it runs, so each frame is short (well under a millisecond)
        and the event loop gets the GIL back at every write."""
        for start in range(0, len(spans), FRAME_SPANS):
            chunk = spans[start : start + FRAME_SPANS]
            try:
                frame = marshal.dumps(chunk if type(chunk) is list else list(chunk))
            except ValueError:  # an attribute of a type marshal does not take: as encoded
                frame = marshal.dumps([plain(f) for f in chunk])
            process = self._live()
            if process is None or process.stdin is None:
                self.dropped += len(chunk)
                continue
            try:
                process.stdin.write(_LENGTH.pack(len(frame)) + frame)
                process.stdin.flush()
            except OSError:  # it died while we wrote: the next frame restarts it
                self.dropped += len(chunk)

    def shutdown(self, timeout_s: float = 15.0) -> None:
        """Close the shipper's stdin and wait for it to post what it has."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(OSError):
            if process.stdin is not None:
                process.stdin.close()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _read_exactly(fd: int, size: int) -> bytes | None:
    """``size`` bytes from ``fd`` (unbuffered, so ``poll`` sees what is left); None
    when it ends first."""
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _waiting(fd: int, timeout_s: float = 0.0) -> bool:
    """Whether more is written to ``fd`` (the next frame, or its start, or its end)
    within ``timeout_s``; ``poll``, not ``select``, which takes no descriptor past 1023."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, math.ceil(timeout_s * 1000))))


def serve(
    fd: int,
    post: Callable[[list[Flat]], None],
    max_spans: int = POST_SPANS,
    waiting: Callable[[int, float], bool] = _waiting,
    hold_s: float = POST_HOLD_S,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Read frames from ``fd`` until it ends and ``post`` their spans: the frames that
    come within ``hold_s`` of the first one read since the last post together, up to
    ``max_spans`` a post (a collector's cost is mostly per request), and what is left
    when it ends."""
    spans: list[Flat] = []
    due = 0.0
    while True:
        head = _read_exactly(fd, _LENGTH.size)
        frame = None if head is None else _read_exactly(fd, _LENGTH.unpack(head)[0])
        if frame is None:
            if spans:
                post(spans)
            return
        if not spans:
            due = clock() + hold_s
        spans += marshal.loads(frame)
        if len(spans) >= max_spans or not waiting(fd, due - clock()):
            post(spans)
            spans = []


def main(argv: Sequence[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    endpoint, resource, timeout_s = argv
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    exporter = OtlpHttpExporter(endpoint, json.loads(resource), float(timeout_s), yield_every=0)
    try:
        serve(sys.stdin.fileno(), exporter.export)
    finally:
        exporter.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
