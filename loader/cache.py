"""L2: a content-addressed blob cache on local disk, shared by processes.

Files are named by their sha256 and are only ever created by renaming a
fully written, hashed and fsync'd temporary file, so a crash or a failed
download never leaves a file that is served. The hash follows the download:
each part is read back and hashed once the parts before it are in
(:class:`fnrt.loader.integrity.Trailing`), so little of it is left when the
last byte lands. A small ``.ok`` record beside
each blob remembers the size, mtime and inode it had when it was last hashed;
a blob whose file no longer matches its record is hashed again before use, and
fetched again if the hash is wrong.

Concurrent requests for one blob download it once: threads of one process
share an in-process lock, processes share an ``flock`` on a lock file. A size
budget evicts least-recently-used blobs, never one that is pinned (in use by
an instance of this process).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from fnrt.functions.errors import IntegrityError
from fnrt.functions.version import check_digest
from fnrt.loader.integrity import (
    Trailing,
    fingerprint,
    read_only,
    read_record,
    recheck,
    write_record,
)
from fnrt.loader.leftovers import writer_gone
from fnrt.loader.stores.base import Written

log = logging.getLogger("fnrt.cache")

#: The mode of a blob in the cache: instances map it, so nobody writes to it.
READ_ONLY = 0o444

#: Writes the blob into the given (temporary) path, telling ``Written`` of each range
#: as it lands (the hash follows them).
Fetch = Callable[[Path, Written], None]


@dataclass(frozen=True)
class CacheConfig:
    root: Path
    budget_bytes: int = 20 * 1024**3

    def __post_init__(self) -> None:
        if self.budget_bytes <= 0:
            raise ValueError("budget_bytes: must be > 0")


@dataclass(frozen=True)
class CacheResult:
    """Where a blob is, and what it took to get it there."""

    path: Path
    fetched: bool  # False: it was already on disk (an L2 hit)
    fetch_s: float = 0.0
    verify_s: float = 0.0


class BlobCache:
    """Blobs by digest under ``root/blobs``; temporary files under ``root/tmp``."""

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.blobs = config.root / "blobs"
        self.tmp = config.root / "tmp"
        self.locks = config.root / "locks"
        for folder in (self.blobs, self.tmp, self.locks):
            folder.mkdir(parents=True, exist_ok=True)
        self._mutex = threading.Lock()
        self._digest_locks: dict[str, threading.Lock] = {}
        self._lru: OrderedDict[str, int] = OrderedDict()  # digest -> size, oldest first
        self._pins: Counter[str] = Counter()
        self.rebuild()

    # --- index -------------------------------------------------------------------

    def rebuild(self) -> None:
        """Re-read the folder: index every blob by last use; drop the temporaries of
        downloads whose process is gone (another process on this cache may be
        downloading into its own right now)."""
        for leftover in self.tmp.iterdir():
            if writer_gone(leftover):
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()  # a download that died; never served
        found = []
        for path in self.blobs.iterdir():
            if path.suffix == ".ok" or path.name.startswith("."):
                continue
            with contextlib.suppress(FileNotFoundError):
                st = path.stat()
                used = max(st.st_atime, st.st_mtime)
                with contextlib.suppress(FileNotFoundError):  # the record's mtime: last use
                    used = max(used, path.with_suffix(".ok").stat().st_mtime)
                found.append((used, path.name, st.st_size))
        with self._mutex:
            self._lru = OrderedDict((name, size) for _, name, size in sorted(found))
        self._make_room(0)  # the budget holds from the start, not only at the next fetch

    @property
    def size_bytes(self) -> int:
        with self._mutex:
            return sum(self._lru.values())

    def __contains__(self, digest: str) -> bool:
        with self._mutex:
            return digest in self._lru

    def path(self, digest: str) -> Path:
        return self.blobs / check_digest(digest)

    # --- pins --------------------------------------------------------------------

    def pin(self, digest: str) -> None:
        """Keep ``digest`` from eviction until a matching :meth:`unpin`."""
        with self._mutex:
            self._pins[digest] += 1

    def unpin(self, digest: str) -> None:
        with self._mutex:
            self._pins[digest] -= 1
            if self._pins[digest] <= 0:
                del self._pins[digest]

    # --- get ---------------------------------------------------------------------

    def get(self, digest: str, fetch: Fetch, size_hint: int = 0) -> CacheResult:
        """The blob's local path, fetching (once, across threads and processes) if needed."""
        path = self.path(digest)
        with self._mutex:
            lock = self._digest_locks.setdefault(digest, threading.Lock())
        with lock, self._file_lock(digest):
            started = time.perf_counter()
            if self._verified(path, digest):
                self._touch(digest, path)
                return CacheResult(path, False, verify_s=time.perf_counter() - started)
            self._make_room(size_hint)
            tmp = self.tmp / f"{digest[:16]}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part"
            hashing = Trailing(tmp)  # while it arrives, range by range
            try:
                fetch(tmp, hashing.written)
                fetched = time.perf_counter()
                found = hashing.result()
                if found.sha256 != digest:
                    raise IntegrityError(digest, found.sha256)
                with tmp.open("rb+") as f:
                    os.fsync(f.fileno())
                os.chmod(tmp, READ_ONLY)  # instances map it: nobody writes to it
                os.replace(tmp, path)
                write_record(path.with_suffix(".ok"), path, found.xxh3)
            finally:
                hashing.close()
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
            self._touch(digest, path)
            return CacheResult(path, True, fetched - started, time.perf_counter() - fetched)

    @contextlib.contextmanager
    def _file_lock(self, digest: str) -> Iterator[None]:
        with (self.locks / digest[:32]).open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _verified(self, path: Path, digest: str) -> bool:
        """True if ``path`` holds ``digest``: by its record (``integrity.recheck``: its
        identity unchanged, else its xxh3), else by its sha256; a mismatch deletes it."""
        if not path.exists():
            return False
        record = path.with_suffix(".ok")
        known = read_record(record)
        if known is not None and recheck(record, path, known):
            return True
        if known is None:  # first seen (or an older record): the full check
            read_only(path)  # instances map it (a blob cached before blobs were made so)
            found = fingerprint(path)
            if found.sha256 == digest:
                write_record(record, path, found.xxh3)
                return True
        log.warning("cached blob %s does not match its digest; fetching it again", digest)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        with contextlib.suppress(FileNotFoundError):
            record.unlink()
        with self._mutex:
            self._lru.pop(digest, None)
        return False

    def _touch(self, digest: str, path: Path) -> None:
        size = path.stat().st_size
        with self._mutex:
            self._lru[digest] = size
            self._lru.move_to_end(digest)
        with contextlib.suppress(OSError):  # the LRU order survives a restart as the
            os.utime(path.with_suffix(".ok"))  # record's mtime (the blob's identity stays)

    def _make_room(self, incoming_bytes: int) -> None:
        with self._mutex:
            victims = choose_evictions(
                self.config.budget_bytes, incoming_bytes, list(self._lru.items()), set(self._pins)
            )
            for digest in victims:
                del self._lru[digest]
        for digest in victims:
            log.info("evicting blob %s from the disk cache", digest)
            for path in (self.path(digest), self.path(digest).with_suffix(".ok")):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()  # an mmap of it stays valid: the inode lives on


def choose_evictions(
    budget_bytes: int, incoming_bytes: int, lru: list[tuple[str, int]], pinned: set[str]
) -> list[str]:
    """Oldest-first blobs to drop so ``incoming_bytes`` fits the budget, skipping pinned ones.

    ``lru`` is (digest, size) from least to most recently used. If the pinned
    blobs alone exceed the budget, as much as possible is freed.
    """
    total = sum(size for _, size in lru)
    victims = []
    for digest, size in lru:
        if total + incoming_bytes <= budget_bytes:
            break
        if digest in pinned:
            continue
        victims.append(digest)
        total -= size
    return victims
