"""Content checks at every load: a blob is what its digest says, cheaply.

A blob's sha256 (its content address) is checked once, when a file is first
seen: fetched into the disk cache (hashed as its parts land: :class:`Trailing`),
first loaded from a folder store, or uploaded to a folder store through this
node (hashed as it was spooled). The
same pass takes an xxh3-128 of the file (about 15 GB/s here, ten times
sha256), kept in a small record beside the file with the file's identity:
size, mtime, ctime, inode and device. A later load compares that identity
with the file's (one ``stat``): unchanged, the content is what was verified
and the load maps it straight away (a cold start from the disk cache at the
floor, ``bench/coldstart.py``); changed in any way, the file is read again
through xxh3. Writing to a file changes its ctime, which no process can set
back (``utime`` restores mtime only), so a file changed in place, even with
its size and mtime restored, is read again and fails: the disk cache fetches
the blob again, a folder store refuses it with an error naming it. What the
identity cannot see is a disk that flips bits with no write; the checksums
of the filesystem or the device are the guard there.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import xxhash

from fnrt.functions.errors import CorruptBlob

_CHUNK = 4 << 20


@dataclass(frozen=True)
class Fingerprint:
    sha256: str
    xxh3: str


class Fingerprinting:
    """sha256 and xxh3-128 of bytes as they pass (a file read, an upload spooled)."""

    def __init__(self) -> None:
        self._sha, self._quick = hashlib.sha256(), xxhash.xxh3_128()

    def update(self, chunk: bytes) -> None:
        self._sha.update(chunk)
        self._quick.update(chunk)

    def result(self) -> Fingerprint:
        return Fingerprint(self._sha.hexdigest(), self._quick.hexdigest())


class Trailing:
    """The fingerprint of a file being written out of order (parallel ranged GETs),
    taken while it is written: a thread reads each range back (from the page cache)
    once every byte before it is in, so the hash ends soon after the last byte lands
    instead of beginning then. :meth:`written` is told of each complete range;
    :meth:`result`, once everything is written, hashes what it was not told of."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._ranges: dict[int, int] = {}  # start -> end of complete ranges not hashed yet
        self._size: int | None = None  # set by result(): all of it is written
        self._stopped = False
        self._hashed = 0
        self._error: BaseException | None = None
        self._hashes = Fingerprinting()
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="fnrt-hash", daemon=True)
        self._thread.start()

    def written(self, start: int, end: int) -> None:
        with self._ready:
            self._ranges[start] = end
            self._ready.notify()

    def result(self) -> Fingerprint:
        """The whole file's fingerprint (blocking), once all of it is written."""
        size = self._path.stat().st_size
        with self._ready:
            self._size = size
            self._ready.notify()
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._hashes.result()

    def close(self) -> None:
        """Stop (the write failed, or the result is taken)."""
        with self._ready:
            self._stopped = True
            self._ready.notify()
        self._thread.join()

    def _until(self) -> int | None:
        """How far the bytes after those hashed may be read now; None: stop."""
        with self._ready:
            while True:
                if self._stopped:
                    return None
                if self._size is not None:
                    return self._size
                end = self._ranges.pop(self._hashed, None)
                if end is not None:
                    return end
                self._ready.wait()

    def _run(self) -> None:
        fd = -1
        try:
            while (end := self._until()) is not None:
                if fd < 0:  # once something is written: the writer creates the file
                    fd = os.open(self._path, os.O_RDONLY)
                while self._hashed < end:
                    chunk = os.pread(fd, min(_CHUNK, end - self._hashed), self._hashed)
                    if not chunk:
                        raise OSError(f"{self._path} ended at byte {self._hashed}, not {end}")
                    self._hashes.update(chunk)
                    self._hashed += len(chunk)
                if end == self._size:
                    return
        except BaseException as exc:  # given to result()
            self._error = exc
        finally:
            if fd >= 0:
                os.close(fd)


def fingerprint(path: Path) -> Fingerprint:
    """sha256 and xxh3-128 of a file in one read."""
    hashes = Fingerprinting()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            hashes.update(chunk)
    return hashes.result()


def quick_digest(path: Path) -> str:
    """xxh3-128 of a file (the check at every load)."""
    quick = xxhash.xxh3_128()
    with path.open("rb") as f:
        buffer = bytearray(_CHUNK)
        view = memoryview(buffer)
        while size := f.readinto(buffer):
            quick.update(view[:size])
    return quick.hexdigest()


def identity(path: Path) -> str:
    """What changes when anything writes to ``path``: size, mtime, ctime, inode, device
    (:func:`identity_of` its stat, as text)."""
    return " ".join(map(str, identity_of(os.stat(path))))


def identity_of(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """A stat's fields that :func:`identity` writes, in its order."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


@dataclass(frozen=True)
class Record:
    """A verified file's identity then, and its xxh3."""

    identity: str
    xxh3: str

    def unchanged(self, path: Path) -> bool:
        """Whether ``path`` is the file verified (no write since): no need to read it."""
        try:
            return identity(path) == self.identity
        except OSError:
            return False


def read_record(record: Path) -> Record | None:
    """The record kept in ``record``, or None (no record, or one of an older format)."""
    with contextlib.suppress(FileNotFoundError, UnicodeDecodeError):
        lines = record.read_text().splitlines()
        if len(lines) >= 2 and lines[1].startswith("xxh3:"):
            return Record(lines[0], lines[1][len("xxh3:") :])
    return None


def write_record(record: Path, path: Path, xxh3: str) -> None:
    """Keep ``path``'s identity and xxh3 in ``record`` (written whole or not at all)."""
    tmp = record.with_name(f".{record.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{identity(path)}\nxxh3:{xxh3}\n")
    os.replace(tmp, record)


def read_only(path: Path) -> None:
    """Take the write permissions off a file instances will map (best effort: a file
    of another owner keeps its mode). Its ctime changes: call it before recording it."""
    with contextlib.suppress(OSError):
        mode = path.stat().st_mode
        if mode & 0o222:
            os.chmod(path, mode & ~0o222)


def recheck(record: Path, path: Path, known: Record) -> bool:
    """Whether ``path`` still holds what ``known`` verified: by its identity (a ``stat``),
    else by reading it through xxh3 (then the record takes its new identity)."""
    if known.unchanged(path):
        return True
    if quick_digest(path) != known.xxh3:
        return False
    write_record(record, path, known.xxh3)  # the same bytes (touched, copied back)
    return True


class Verifier:
    """Checks blobs read in place (a folder store) at every load; records under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def check(self, path: Path, digest: str) -> None:
        """Raise IntegrityError unless ``path`` holds ``digest``: by sha256 the first
        time, by its record after that (:func:`recheck`)."""
        record = self.root / digest
        known = read_record(record)
        if known is not None:
            if recheck(record, path, known):
                return
            raise CorruptBlob(digest, str(path), "changed since it was verified")
        read_only(path)  # a blob written before blobs were made so: first, then hashed
        found = fingerprint(path)
        if found.sha256 != digest:
            raise CorruptBlob(digest, str(path), f"it hashes to sha256:{found.sha256}")
        write_record(record, path, found.xxh3)

    def record(self, path: Path, found: Fingerprint) -> None:
        """Take ``path`` as verified: ``found`` is the fingerprint of the bytes just
        written there (an upload this node hashed as it spooled it), so its first load
        here needs no sha256 of its own (about 1 s a GB)."""
        write_record(self.root / found.sha256, path, found.xxh3)


def bundle_files(bundle: bytes) -> dict[str, str]:
    """The xxh3 of each file a code bundle (``.tar.gz``) holds, by its path in it."""
    import gzip
    import io
    import tarfile

    files: dict[str, str] = {}
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(bundle)), mode="r") as tar:
        for member in tar.getmembers():
            if member.isfile():
                data = tar.extractfile(member)
                assert data is not None
                files[member.name] = xxhash.xxh3_128_hexdigest(data.read())
    return files


def tree_differences(folder: Path, expected: Mapping[str, str]) -> list[str]:
    """Files of ``folder`` that differ from ``expected`` (:func:`bundle_files` of the
    bundle it was unpacked from): changed, missing or added (``__pycache__`` aside).
    Empty when it is intact. A link to a folder, which no bundle unpacks, and an entry
    that cannot be read (a link loop, a folder or file gone meanwhile) are differences
    of their own, so the tree is unpacked again; a link to a file counts as that file,
    a broken link as nothing. Walked with ``os.scandir`` (every load checks it:
    ``pathlib``'s ``rglob`` took three times as long for a handler's few files)."""
    found: dict[str, str] = {}
    pending = [(os.fspath(folder), "")]
    while pending:
        where, prefix = pending.pop()
        try:
            with os.scandir(where) as listed:
                entries = list(listed)
        except OSError as exc:  # gone or unreadable: what it held counts as missing
            if prefix:
                found[prefix.rstrip("/")] = f"unreadable: {exc.strerror}"
            continue
        for entry in entries:
            if entry.name == "__pycache__":
                continue
            name = prefix + entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append((entry.path, name + "/"))
                elif entry.is_dir():
                    found[name] = "a link to a folder"
                elif entry.is_file():
                    with open(entry.path, "rb") as f:
                        found[name] = xxhash.xxh3_128_hexdigest(f.read())
            except OSError as exc:
                found[name] = f"unreadable: {exc.strerror}"
    return sorted(
        name for name in expected.keys() | found.keys() if expected.get(name) != found.get(name)
    )
