"""Uploading a packed function: only the blobs the destination lacks, with a progress bar."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from tqdm import tqdm

from fnrt.functions.bundle import Bundle


class BlobSink(Protocol):
    """Where blobs go: a Repository (straight to a store) or a Client (through a server)."""

    def has_blob(self, digest: str) -> bool: ...

    def put_blob(
        self, digest: str, source: Path | bytes, progress: Callable[[int], None] | None = None
    ) -> bool: ...


def upload_bundle(sink: BlobSink, bundle: Bundle, *, show_progress: bool = True) -> tuple[int, int]:
    """Upload every missing blob of ``bundle``; returns (blobs uploaded, bytes uploaded)."""
    missing: dict[str, Path | bytes] = {}
    sizes: dict[str, int] = {}
    for ref, source in bundle.blob_sources():
        if ref.digest not in missing and not sink.has_blob(ref.digest):
            missing[ref.digest] = source
            sizes[ref.digest] = ref.size_bytes
    total = sum(sizes.values())
    with tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc="upload",
        disable=not show_progress or total == 0,
        file=sys.stderr,
    ) as bar:
        for digest, source in missing.items():
            sink.put_blob(digest, source, bar.update)
    return len(missing), total
