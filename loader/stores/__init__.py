"""Object stores, one module per backend, chosen by URI with :func:`open_store`."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from fnrt.loader.stores.base import KeyNotFound, ObjectStore, PreconditionFailed, Progress
from fnrt.loader.stores.file import FileStore
from fnrt.loader.stores.s3 import S3Config, S3Store

__all__ = [
    "FileStore",
    "KeyNotFound",
    "ObjectStore",
    "PreconditionFailed",
    "Progress",
    "S3Config",
    "S3Store",
    "open_store",
]


def open_store(location: str | Path, s3: S3Config | None = None) -> ObjectStore:
    """The store at ``location``: a folder path, ``file://PATH`` or ``s3://bucket[/prefix]``."""
    text = str(location)
    parsed = urlparse(text)
    if parsed.scheme in ("", "file"):
        path = unquote(parsed.path) if parsed.scheme == "file" else text
        return FileStore(Path(path))
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"{text!r} names no bucket: use s3://bucket/prefix")
        return S3Store(parsed.netloc, parsed.path.strip("/"), s3)
    raise ValueError(f"unsupported store {text!r}: use a folder, file://PATH or s3://bucket/prefix")
