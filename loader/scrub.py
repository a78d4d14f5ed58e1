"""Weight files changed under a live instance: found, and never served.

Instances memory-map their weights (``mmap``, ``torch.load(mmap=True)``), so a
write to a mapped file reaches a running instance at once. The files fnrt maps
are read-only (``0444``: the disk cache's blobs and a folder store's), which
stops other users but not root or the owner. So the files each loaded instance
maps are watched, against what was verified when it loaded (the record of
:mod:`fnrt.loader.integrity`: the file's identity and its xxh3):

- every ``interval_s`` (and after each batch the instance runs) each file's
  identity is read (one ``stat``): any ``write``, ``truncate``, rename over it or
  removal changes it, even with the mtime put back (the ctime cannot be);
- a thread reads the files again through xxh3, at most ``rate_bytes_s`` a second
  and at idle I/O priority where Linux grants it, round after round: a change
  that leaves the identity alone (a write through another process's shared
  mapping on a file system that does not update the times, bits flipped on the
  disk) is found within the time one round takes (the files' size / the rate).

A file found changed marks every :class:`Watch` that holds it: the runtime stops
using those instances (what a batch computed after that is not served) and
loads again, from a verified copy (the disk cache fetches the blob again; a
folder store refuses a changed blob, naming it).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import platform
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import xxhash

from fnrt.loader.integrity import identity_of

log = logging.getLogger("fnrt.scrub")

_CHUNK = 4 << 20


@dataclass(frozen=True)
class ScrubConfig:
    """How often mapped files are stat'ed, and how fast they are read again."""

    interval_s: float = 10.0
    rate_bytes_s: int = 64 * 1024 * 1024  # 0: no reading again (the stat alone)

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError("interval_s: must be > 0")
        if self.rate_bytes_s < 0:
            raise ValueError("rate_bytes_s: must be >= 0 (0: no re-reading)")


@dataclass(frozen=True)
class Mapped:
    """A file an instance maps, as it was verified: its identity then and its xxh3."""

    path: Path
    digest: str
    identity: str
    xxh3: str
    # the identity's fields and the path as os.stat takes them: a check after each batch
    # compares the stat's numbers, with no string made and no pathlib between
    _stat: tuple[str, tuple[int, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fields = tuple(int(part) for part in self.identity.split())
        object.__setattr__(self, "_stat", (os.fspath(self.path), fields))

    def unchanged(self) -> bool:
        path, fields = self._stat
        try:
            return identity_of(os.stat(path)) == fields
        except OSError:  # removed, or its folder: not what was verified
            return False


def pause_s(read_bytes: int, rate_bytes_s: int, elapsed_s: float) -> float:
    """How long to wait before reading more, having read ``read_bytes`` in ``elapsed_s``,
    to stay at ``rate_bytes_s`` on average."""
    return max(0.0, read_bytes / rate_bytes_s - elapsed_s)


class Watch:
    """The files one instance maps, and why it must not serve (None while it may)."""

    def __init__(
        self, files: Iterable[Mapped], release: Callable[[Watch], None] | None = None
    ) -> None:
        self.files = tuple(files)
        self._release = release
        self.reason: str | None = None
        #: called once, from the thread that found the change (the scrub's, or the
        #: caller of :meth:`check`)
        self.on_change: Callable[[str], None] = lambda _: None
        self._lock = threading.Lock()

    def close(self) -> None:
        """Stop watching (the instance is gone)."""
        if self._release is not None:
            self._release(self)

    def flag(self, reason: str) -> None:
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
        log.error("%s: the instance mapping it stops serving", reason)
        self.on_change(reason)

    def check(self) -> str | None:
        """Why the instance must not serve, by a ``stat`` of each of its files now (a few
        microseconds each), or None."""
        if self.reason is None:
            for mapped in self.files:
                if not mapped.unchanged():
                    self.flag(changed_reason(mapped, "its identity changed (written to)"))
                    break
        return self.reason


def changed_reason(mapped: Mapped, how: str) -> str:
    return (
        f"weights blob sha256:{mapped.digest} at {mapped.path} changed under a live "
        f"instance ({how})"
    )


class Scrubber:
    """Watches the files of loaded instances from a thread of its own (:meth:`start`)."""

    def __init__(
        self,
        config: ScrubConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or ScrubConfig()
        self._clock = clock
        self._watches: set[Watch] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cursor = 0  # which file the reading goes on with
        self._offset = 0  # and where in it
        self._hashing: tuple[Path, str, xxhash.xxh3_128] | None = None
        #: files read whole again, and changes found (for tests and metrics)
        self.files_read = 0
        self.rounds = 0

    def watch(self, files: Iterable[Mapped]) -> Watch:
        watch = Watch(files, self.unwatch)
        with self._lock:
            self._watches.add(watch)
        return watch

    def unwatch(self, watch: Watch) -> None:
        with self._lock:
            self._watches.discard(watch)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="fnrt-scrub", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # --- one pass ----------------------------------------------------------------------

    def stat_all(self) -> None:
        """Check every watched file's identity (a ``stat`` each)."""
        with self._lock:
            watches = list(self._watches)
        for watch in watches:
            watch.check()

    def _files(self) -> list[Mapped]:
        """The distinct files watched, in a stable order."""
        with self._lock:
            found = {(m.path, m.digest): m for w in self._watches for m in w.files}
        return [found[k] for k in sorted(found)]

    def read_some(self, budget_bytes: int) -> int:
        """Read up to ``budget_bytes`` more of the watched files through xxh3, going on
        where the last call stopped; a file whose xxh3 differs from the one verified
        marks its watches. The bytes read."""
        files = self._files()
        if not files:
            return 0
        read = 0
        ended = 0  # files ended in this call: all of them, and none had bytes, is the end
        while read < budget_bytes and ended <= len(files):
            mapped = files[self._cursor % len(files)]
            try:
                done, count = self._read_on(mapped, budget_bytes - read)
            except OSError:  # gone: the stat finds it
                done, count = True, 0
                self._hashing = None
            read += count
            if done:
                ended += 1
                self._cursor += 1
                self._offset = 0
                if self._cursor % len(files) == 0:
                    self.rounds += 1
        return read

    def _read_on(self, mapped: Mapped, budget: int) -> tuple[bool, int]:
        if self._hashing is None or self._hashing[:2] != (mapped.path, mapped.digest):
            self._hashing = (mapped.path, mapped.digest, xxhash.xxh3_128())
            self._offset = 0
        quick = self._hashing[2]
        read = 0
        with mapped.path.open("rb") as f:
            f.seek(self._offset)
            while read < budget:
                chunk = f.read(min(_CHUNK, budget - read))
                if not chunk:
                    self._hashing = None
                    self.files_read += 1
                    if quick.hexdigest() != mapped.xxh3:
                        self._flag_path(mapped, "its content differs from what was verified")
                    return True, read
                quick.update(chunk)
                read += len(chunk)
                self._offset += len(chunk)
        return False, read

    def _flag_path(self, mapped: Mapped, how: str) -> None:
        with self._lock:
            holders = [w for w in self._watches if mapped in w.files]
        for watch in holders:
            watch.flag(changed_reason(mapped, how))

    # --- the thread ------------------------------------------------------------------

    def _run(self) -> None:
        _idle_io_priority()
        rate = self.config.rate_bytes_s
        while not self._stop.is_set():
            started = self._clock()
            try:
                self.stat_all()
                if rate:  # one interval's worth, paced over it, and one round at most:
                    budget = int(rate * self.config.interval_s)  # small files are read
                    read = 0  # once an interval, not again and again at the full rate
                    rounds = self.rounds
                    while read < budget and self.rounds == rounds and not self._stop.is_set():
                        step = self.read_some(min(_CHUNK, budget - read))
                        if step == 0:
                            break
                        read += step
                        wait = pause_s(read, rate, self._clock() - started)
                        if wait and self._stop.wait(wait):
                            return
            except Exception:  # never let the watch die: log, and go on next interval
                log.exception("the scrub of mapped files failed; going on")
            left = self.config.interval_s - (self._clock() - started)
            if self._stop.wait(max(left, 0.0)):
                return


#: ioprio_set's syscall number, where known
_IOPRIO_SET = {"x86_64": 251, "aarch64": 30}.get(platform.machine())


def _idle_io_priority() -> None:
    """Ask Linux to give this thread's reads the idle I/O class (best effort)."""
    if _IOPRIO_SET is None or not hasattr(os, "gettid"):
        return
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        idle_class = 3 << 13  # IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT
        libc.syscall(_IOPRIO_SET, 1, os.gettid(), idle_class)  # IOPRIO_WHO_PROCESS: a thread
