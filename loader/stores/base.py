"""The object store interface every backend implements.

Keys are ``/``-separated relative paths (``blobs/sha256/<hex>``). Writes are
atomic: a reader sees the old object or the new one, never a part. Metadata
writes can be conditional, which is how ``routing.json`` changes safely from
several nodes at once.
"""

from __future__ import annotations

import builtins
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from fnrt.functions.errors import FnrtError, NotFound

#: Called with the number of bytes moved since the last call.
Progress = Callable[[int], None]
#: Told that the bytes ``[start, end)`` of a file being written are in it.
Written = Callable[[int, int], None]


class KeyNotFound(NotFound):
    def __init__(self, uri: str, key: str) -> None:
        super().__init__(f"no object '{key}' in store {uri}", key=key)


class PreconditionFailed(FnrtError):
    """A conditional write found the object changed (or present, or absent)."""


def check_key(key: str) -> str:
    """Refuse keys that could escape the store (absolute, ``..``, empty parts)."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid store key {key!r}")
    return key


class ObjectStore(Protocol):
    """A place that keeps fnrt's state: blobs, version manifests, routing."""

    uri: str
    #: Requests made to the store, by operation (S3: every HTTP request sent).
    requests: Counter[str]

    def get(self, key: str) -> tuple[bytes, str]:
        """The object's bytes and its ETag; raises KeyNotFound."""
        ...

    def get_if_changed(self, key: str, etag: str) -> tuple[bytes, str] | None:
        """Like ``get``, or None when the object's ETag is still ``etag`` (a
        conditional GET: S3 answers 304 and sends no body)."""
        ...

    def put(
        self, key: str, data: bytes, *, if_match: str | None = None, if_absent: bool = False
    ) -> str:
        """Write an object atomically; return its new ETag.

        ``if_match`` writes only if the current ETag is that one; ``if_absent``
        writes only if there is no object yet. Either failing raises
        PreconditionFailed.
        """
        ...

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> None:
        """Write a (large) object from chunks, atomically."""
        ...

    def put_file(self, key: str, path: Path, progress: Progress | None = None) -> None:
        """Write a local file as an object, atomically (multipart where the store has it)."""
        ...

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str) -> list[str]:
        """Keys that start with ``prefix``, sorted."""
        ...

    def list_folders(
        self, prefix: str, after: str = "", limit: int | None = None
    ) -> builtins.list[str]:
        """The names one level below ``prefix`` (a folder, ending in "/") that hold a key,
        in key order (``name + "/"``, as S3 lists them), each after ``after``; at most
        ``limit`` of them. A page of names costs about the same however many there are."""
        ...

    def delete(self, key: str) -> None:
        """Remove an object; a missing one is not an error."""
        ...

    def local_path(self, key: str) -> Path | None:
        """A local file holding the object, when the store is on this disk."""
        ...

    def download(
        self,
        key: str,
        dest: Path,
        progress: Progress | None = None,
        written: Written | None = None,
    ) -> None:
        """Copy an object into the local file ``dest`` (written in place); ``written`` is
        told of each range ``[start, end)`` once it is in ``dest`` (a store that writes
        in ranges; another may tell nothing)."""
        ...
