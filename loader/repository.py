"""fnrt's state in an object store: blobs, version manifests, routing.

Layout (see docs/storage.md)::

    blobs/sha256/<hex>                    immutable artifacts and code bundles
    functions/<name>/versions/<v>.json    immutable version manifests
    functions/<name>/routing.json         which versions get what share of traffic
    changes.json                          the change feed: which routing moved lately

The store is the source of truth: any number of nodes serve the same functions
by reading it, and ``routing.json`` only changes by a conditional write, after
which the change is appended to ``changes.json`` (``fnrt.loader.changes``).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fnrt.functions.bundle import file_digest
from fnrt.functions.errors import (
    BlobNotFound,
    Conflict,
    FunctionNotFound,
    IntegrityError,
    VersionNotFound,
)
from fnrt.functions.manifest import NAME_PATTERN, check_name
from fnrt.functions.routing import Routing
from fnrt.functions.version import VersionManifest, check_digest
from fnrt.loader.changes import FEED_KEY, Feed
from fnrt.loader.stores.base import KeyNotFound, ObjectStore, PreconditionFailed, Written

_CAS_ATTEMPTS = 16
#: What a version id may look like (fnrt makes ``v-`` and 12 hex digits): anything else
#: a client names (a header, a path) is no stored version, and is not looked for (a
#: name past the file system's limit failed the read with an OSError, a 500).
VERSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: The feed is one object every deploy writes: more tries, with jittered waits.
_FEED_ATTEMPTS = 64
_FEED_BACKOFF_S = 0.02


def blob_key(digest: str) -> str:
    return f"blobs/sha256/{check_digest(digest)}"


def function_prefix(name: str) -> str:
    """``functions/<name>/`` for a name read from a request; FunctionNotFound if no
    function could have that name."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise FunctionNotFound(str(name))
    return f"functions/{name}/"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _chunks(source: bytes | Iterable[bytes]) -> Iterable[bytes]:
    if isinstance(source, bytes):
        yield source
    else:
        yield from source


class _Hashing:
    """Wraps a chunk stream, hashing and counting what passes through."""

    def __init__(self, chunks: Iterable[bytes], on_chunk: Callable[[int], None] | None) -> None:
        self._chunks = chunks
        self._on_chunk = on_chunk
        self.sha = hashlib.sha256()
        self.size = 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._chunks:
            self.sha.update(chunk)
            self.size += len(chunk)
            if self._on_chunk is not None:
                self._on_chunk(len(chunk))
            yield chunk


class Repository:
    """Typed access to the fnrt layout in one :class:`ObjectStore`."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    # --- blobs ---------------------------------------------------------------

    def has_blob(self, digest: str) -> bool:
        return self.store.exists(blob_key(digest))

    def put_blob(
        self,
        digest: str,
        source: Path | bytes | Iterable[bytes],
        progress: Callable[[int], None] | None = None,
        *,
        sha256: str | None = None,
    ) -> bool:
        """Store content under its sha256; False if it was already there.

        Content that does not hash to ``digest`` is refused and nothing is kept.
        A file is hashed before it is sent (so S3 gets a multipart upload), unless
        ``sha256`` gives its hash (the caller hashed it as it wrote it); a stream
        is hashed as it is written.
        """
        key = blob_key(digest)
        if self.store.exists(key):
            return False
        if isinstance(source, Path):
            actual = sha256 if sha256 is not None else file_digest(source)
            if actual != digest:
                raise IntegrityError(digest, actual)
            self.store.put_file(key, source, progress)
            return True
        hashing = _Hashing(_chunks(source), progress)

        def verified() -> Iterable[bytes]:
            yield from hashing
            actual = hashing.sha.hexdigest()
            if actual != digest:
                raise IntegrityError(digest, actual)

        self.store.put_stream(key, verified())
        return True

    def read_blob(self, digest: str) -> bytes:
        try:
            data, _ = self.store.get(blob_key(digest))
        except KeyNotFound:
            raise BlobNotFound(digest) from None
        return data

    def download_blob(self, digest: str, dest: Path, written: Written | None = None) -> None:
        """Copy a blob into the local file ``dest`` (parallel ranged GETs on S3, each
        told to ``written`` once it is in)."""
        try:
            self.store.download(blob_key(digest), dest, written=written)
        except KeyNotFound:
            raise BlobNotFound(digest) from None

    def blob_path(self, digest: str) -> Path | None:
        """The blob's local file when the store is on this disk, else None."""
        return self.store.local_path(blob_key(digest))

    # --- versions ------------------------------------------------------------

    def put_version(self, vm: VersionManifest) -> bool:
        """Store a version manifest once; False if that version already exists.

        Every blob it names must already be in the store.
        """
        for ref in vm.blobs():
            if not self.has_blob(ref.digest):
                raise BlobNotFound(ref.digest)
        key = f"functions/{vm.name}/versions/{vm.version}.json"
        try:
            self.store.put(key, vm.to_json(), if_absent=True)
        except PreconditionFailed:
            return False
        return True

    def get_version(self, name: str, version: str) -> VersionManifest:
        return VersionManifest.from_dict(self.read_version(name, version))

    def read_version(self, name: str, version: str) -> dict[str, Any]:
        """A version manifest as stored, unchecked: for a glance (a listing, whether it
        loads at start); :meth:`get_version` checks what it serves."""
        if not VERSION_ID.fullmatch(version):
            raise VersionNotFound(name, version)
        try:
            data, _ = self.store.get(f"functions/{check_name(name)}/versions/{version}.json")
            found = json.loads(data)
        except (KeyNotFound, ValueError):
            raise VersionNotFound(name, version) from None
        if not isinstance(found, dict) or not isinstance(found.get("manifest"), dict):
            raise VersionNotFound(name, version)
        return found

    def list_versions(self, name: str) -> list[str]:
        prefix = function_prefix(name) + "versions/"
        return [
            k[len(prefix) : -len(".json")] for k in self.store.list(prefix) if k.endswith(".json")
        ]

    # --- routing -------------------------------------------------------------

    def get_routing(self, name: str) -> tuple[Routing, str]:
        """The function's routing and its ETag; raises FunctionNotFound."""
        try:
            data, etag = self.store.get(function_prefix(name) + "routing.json")
        except KeyNotFound:
            raise FunctionNotFound(name) from None
        return Routing.from_json(data), etag

    def update_routing(self, name: str, change: Callable[[Routing | None], Routing]) -> Routing:
        """Apply ``change`` to the current routing with a compare-and-swap loop.

        ``change`` gets None when the function has no routing yet. A lost race
        re-reads and re-applies, so concurrent deploys never corrupt the file.
        """
        key = f"functions/{check_name(name)}/routing.json"
        for _ in range(_CAS_ATTEMPTS):
            try:
                data, etag = self.store.get(key)
                current: Routing | None = Routing.from_json(data)
            except KeyNotFound:
                current, etag = None, ""
            routing = change(current)
            try:
                if current is None:
                    self.store.put(key, routing.to_json(), if_absent=True)
                else:
                    self.store.put(key, routing.to_json(), if_match=etag)
            except PreconditionFailed:
                continue
            self.record_change(name)
            return routing
        raise Conflict(f"routing of '{name}' kept changing; gave up after {_CAS_ATTEMPTS} tries")

    # --- the change feed -----------------------------------------------------

    def record_change(self, name: str) -> int:
        """Append ``name`` to the change feed (a conditional write); its generation."""
        for attempt in range(_FEED_ATTEMPTS):
            try:
                data, etag = self.store.get(FEED_KEY)
                feed: Feed | None = Feed.from_json(data)
            except KeyNotFound:
                feed, etag = None, ""
            after = (feed or Feed()).appended(name, now_iso())
            try:
                if feed is None:
                    self.store.put(FEED_KEY, after.to_json(), if_absent=True)
                else:
                    self.store.put(FEED_KEY, after.to_json(), if_match=etag)
            except PreconditionFailed:
                time.sleep(random.uniform(0, _FEED_BACKOFF_S * min(attempt + 1, 8)))
                continue
            return after.generation
        raise Conflict(f"the change feed kept changing; gave up after {_FEED_ATTEMPTS} tries")

    def read_feed(self, etag: str = "") -> tuple[Feed, str] | None:
        """The change feed and its ETag, or None while its ETag is still ``etag``
        (one conditional GET). A store with no feed yet has an empty one."""
        try:
            found = self.store.get_if_changed(FEED_KEY, etag) if etag else self.store.get(FEED_KEY)
        except KeyNotFound:
            return None if etag == "-" else (Feed(), "-")
        if found is None:
            return None
        data, new_etag = found
        return Feed.from_json(data), new_etag

    def list_functions(self, after: str = "", limit: int | None = None) -> list[str]:
        """Deployed functions' names in the store's key order (``name + "/"``): all of
        them, or the ``limit`` after ``after`` (one listing of that page, whatever the
        number deployed). A function being deleted may be listed until its versions are
        gone: readers of its routing find it missing and pass it by."""
        names: list[str] = []
        while limit is None or len(names) < limit:
            want = None if limit is None else limit - len(names)
            page = self.store.list_folders("functions/", after, want)
            names += [n for n in page if NAME_PATTERN.match(n)]  # a folder no deploy made
            if want is None or len(page) < want or f"{page[-1]}/" <= f"{after}/":
                break  # the last page (or a store that would list the same page again)
            after = page[-1]
        return names

    def delete_function(self, name: str) -> None:
        """Remove the routing and version manifests (blobs stay: they may be shared)."""
        self.get_routing(name)
        self.store.delete(function_prefix(name) + "routing.json")
        for version in self.list_versions(name):
            self.store.delete(f"functions/{name}/versions/{version}.json")
        self.record_change(name)
