"""Object stores, one module per backend, chosen by URI with :func:`open_store`."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from fnrt.loader.stores.base import KeyNotFound, ObjectStore, PreconditionFailed, Progress
from fnrt.loader.stores.file import FileStore

__all__ = [
    "FileStore",
    "KeyNotFound",
    "ObjectStore",
    "PreconditionFailed",
    "Progress",
    "open_store",
]


def open_store(location: str | Path) -> ObjectStore:
    """The store at ``location``: a folder path or ``file://`` URI.

    (``s3://bucket/prefix`` joins when the S3 backend lands.)
    """
    text = str(location)
    parsed = urlparse(text)
    if parsed.scheme in ("", "file"):
        path = unquote(parsed.path) if parsed.scheme == "file" else text
        return FileStore(Path(path))
    raise ValueError(f"unsupported store {text!r}: use a folder path or file://PATH")
