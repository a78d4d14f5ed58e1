"""Turning a version manifest into a running instance of its handler.

Everything here blocks (file I/O, imports, the handler's ``load``); the runtime
calls it on the instance's own executor thread, never on the event loop.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from fnrt.functions.bundle import unpack_code
from fnrt.functions.errors import BlobNotFound
from fnrt.functions.handler import Device, Request, bundle_package, import_handler
from fnrt.functions.tensors import coerce_result
from fnrt.functions.version import ArtifactRef, VersionManifest
from fnrt.loader.artifact import LocalArtifact
from fnrt.loader.repository import Repository


@dataclass
class Instance:
    """A loaded handler with the thread it runs on.

    ``run`` is called on ``executor``'s single thread: the same thread that ran
    ``load``, so thread-bound state (CUDA streams, torch settings) carries over.
    """

    version: VersionManifest
    call: Callable[[list[Request]], Sequence[Any]]
    executor: ThreadPoolExecutor
    unload: Callable[[], None] | None = None
    timings_s: dict[str, float] = field(default_factory=dict)
    size_bytes: int = 0

    def run(self, batch: list[Request]) -> list[dict[str, np.ndarray[Any, Any]]]:
        """Call the handler on one batch; raise ValueError if it breaks the contract."""
        results = self.call(batch)
        if isinstance(results, dict | str | bytes) or not isinstance(results, Sequence):
            raise ValueError(
                "handler must return a list with one result per request, "
                f"got {type(results).__name__}"
            )
        if len(results) != len(batch):
            raise ValueError(
                f"handler returned {len(results)} results for a batch of {len(batch)} requests"
            )
        outputs = self.version.manifest.outputs
        return [coerce_result(outputs, r) for r in results]

    def close(self) -> None:
        """Run the handler's ``unload`` (if any) on its thread and stop the thread."""
        if self.unload is not None:
            with contextlib.suppress(Exception):
                self.executor.submit(self.unload).result()
        self.executor.shutdown(wait=False)
        self.call = _closed
        self.unload = None


def _closed(batch: list[Request]) -> Sequence[Any]:
    raise RuntimeError("instance is closed")


class InstanceLoader:
    """Materialises versions from a :class:`Repository` and loads their handlers."""

    def __init__(self, repository: Repository, cache_dir: Path, device: Device) -> None:
        self.repository = repository
        self.cache_dir = cache_dir
        self.device = device

    def _blob_path(self, digest: str) -> Path:
        path = self.repository.blob_path(digest)
        if path is None:
            raise BlobNotFound(digest)
        return path

    def code_dir(self, vm: VersionManifest) -> Path:
        """The version's code, unpacked once per bundle digest (atomically)."""
        dest = self.cache_dir / "code" / vm.bundle.digest
        if dest.is_dir():
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".unpack-"))
        try:
            unpack_code(self.repository.read_blob(vm.bundle.digest), tmp)
            os.replace(tmp, dest)
        except OSError:
            if not dest.is_dir():  # another process won the race only if dest exists
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return dest

    def artifact_path(self, ref: ArtifactRef) -> Path:
        """A local path for an artifact: the blob itself, or a folder of links to blobs."""
        if not ref.is_dir:
            return self._blob_path(ref.files[0].digest)
        dest = self.cache_dir / "trees" / ref.digest
        if dest.is_dir():
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".tree-"))
        try:
            for f in ref.files:
                link = tmp / f.rel
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(self._blob_path(f.digest))
            os.replace(tmp, dest)
        except OSError:
            if not dest.is_dir():
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return dest

    def handler_object(self, vm: VersionManifest) -> object:
        """Import the version's handler and check its contract (deploy-time validation)."""
        return import_handler(self.code_dir(vm), vm.manifest, bundle_package(vm.bundle.digest))

    def load(self, vm: VersionManifest, executor: ThreadPoolExecutor) -> Instance:
        """Build an instance; call this on ``executor``'s thread."""
        timings: dict[str, float] = {}
        start = time.perf_counter()
        obj = self.handler_object(vm)
        timings["import_s"] = time.perf_counter() - start

        mark = time.perf_counter()
        artifacts = {
            key: LocalArtifact(
                key, self.artifact_path(ref), ref.digest, ref.size_bytes, self.device
            )
            for key, ref in vm.artifacts.items()
        }
        timings["fetch_s"] = time.perf_counter() - mark

        mark = time.perf_counter()
        unload: Callable[[], None] | None = None
        handler = obj() if inspect.isclass(obj) else obj  # a class is instantiated once
        if handler is not obj:
            load = getattr(handler, "load", None)
            if load is not None:
                load(artifacts, self.device)
            unload = getattr(handler, "unload", None)
        call = cast(Callable[[list[Request]], Sequence[Any]], handler)
        timings["load_s"] = time.perf_counter() - mark
        timings["total_s"] = time.perf_counter() - start
        return Instance(vm, call, executor, unload, timings, vm.size_bytes)
