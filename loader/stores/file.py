"""The embedded object store: a folder on local disk (``file://``).

Objects are plain files, so blobs can be memory-mapped where they lie. Every
write goes to a temporary name in the same folder, is fsync'd, and is renamed
over the target; conditional writes hold an exclusive ``flock`` on a lock file
for the check and the rename, so they are safe across processes.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import os
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

from fnrt.loader.stores.base import (
    KeyNotFound,
    PreconditionFailed,
    Progress,
    Written,
    check_key,
)

_CHUNK = 1024 * 1024
#: The mode of a blob: instances map blobs where they lie, so nobody writes to them.
READ_ONLY = 0o444


def _etag(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


class FileStore:
    """An object store in the folder ``root`` (created on first write)."""

    def __init__(self, root: Path) -> None:
        self.root = root.expanduser().resolve()
        self.uri = self.root.as_uri()
        self.requests: Counter[str] = Counter()  # metadata reads and writes, by operation

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def get(self, key: str) -> tuple[bytes, str]:
        self.requests["GetObject"] += 1
        try:
            data = self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            raise KeyNotFound(self.uri, key) from None
        return data, _etag(data)

    def get_if_changed(self, key: str, etag: str) -> tuple[bytes, str] | None:
        data, current = self.get(key)
        return None if current == etag else (data, current)

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        lock_dir = self.root / ".locks"
        lock_dir.mkdir(parents=True, exist_ok=True)
        lock_name = hashlib.sha256(key.encode()).hexdigest()[:24]
        with (lock_dir / lock_name).open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _write_atomic(self, path: Path, chunks: Iterable[bytes]) -> None:
        blob = path.relative_to(self.root).parts[0] == "blobs"
        write_atomic(path, chunks, READ_ONLY if blob else None)

    def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_absent: bool = False
    ) -> str:
        path = self._path(key)
        self.requests["PutObject"] += 1
        if if_match is None and not if_absent:
            self._write_atomic(path, [data])
            return _etag(data)
        with self._locked(key):
            exists = path.exists()
            if if_absent and exists:
                raise PreconditionFailed(f"object '{key}' already exists", key=key)
            if if_match is not None:
                current = _etag(path.read_bytes()) if exists else None
                if current != if_match:
                    raise PreconditionFailed(f"object '{key}' changed since it was read", key=key)
            self._write_atomic(path, [data])
        return _etag(data)

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> None:
        self._write_atomic(self._path(key), chunks)

    def put_file(self, key: str, path: Path, progress: Progress | None = None) -> None:
        def chunks() -> Iterator[bytes]:
            with path.open("rb") as f:
                while chunk := f.read(_CHUNK):
                    if progress is not None:
                        progress(len(chunk))
                    yield chunk

        self._write_atomic(self._path(key), chunks())

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str) -> list[str]:
        self.requests["ListObjectsV2"] += 1
        base = self.root / prefix if prefix else self.root
        if not prefix.endswith("/") and prefix:
            base = base.parent
        if not base.is_dir():
            return []
        keys = []
        for path in base.rglob("*"):
            if path.is_file() and not path.name.startswith("."):
                key = path.relative_to(self.root).as_posix()
                if key.startswith(prefix) and not key.startswith(".locks/"):
                    keys.append(key)
        return sorted(keys)

    def list_folders(
        self, prefix: str, after: str = "", limit: int | None = None
    ) -> builtins.list[str]:
        self.requests["ListObjectsV2"] += 1
        base = self.root / prefix
        try:
            with os.scandir(base) as entries:
                found_dirs = [e.name for e in entries if e.is_dir()]
            start = f"{after}/" if after else ""
            names = sorted((n for n in found_dirs if f"{n}/" > start), key=lambda n: f"{n}/")
        except FileNotFoundError:
            return []
        found: builtins.list[str] = []
        for name in names:  # a folder left empty (its keys deleted) holds no key
            if limit is not None and len(found) >= limit:
                break
            if any(p.is_file() and not p.name.startswith(".") for p in (base / name).rglob("*")):
                found.append(name)
        return found

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()

    def local_path(self, key: str) -> Path | None:
        path = self._path(key)
        return path if path.is_file() else None

    def download(
        self,
        key: str,
        dest: Path,
        progress: Progress | None = None,
        written: Written | None = None,
    ) -> None:
        src = self._path(key)
        try:
            with src.open("rb") as fin, dest.open("wb") as fout:
                while chunk := fin.read(_CHUNK):
                    fout.write(chunk)
                    if progress is not None:
                        progress(len(chunk))
        except FileNotFoundError:
            raise KeyNotFound(self.uri, key) from None

    def __repr__(self) -> str:
        return f"FileStore({self.uri})"


def write_atomic(path: Path, chunks: Iterable[bytes], mode: int | None = None) -> None:
    """Write ``path`` whole or not at all: a temporary name beside it, fsync'd, renamed
    (given ``mode``, it has that mode before it takes the name)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # the writer's pid in the name: a node removes those of dead writers at start
    prefix = f".{path.name}.{os.getpid()}."
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
