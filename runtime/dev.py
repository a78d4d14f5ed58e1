"""Live reload for development: redeploy a handler folder whenever it changes.

``fnrt dev PATH`` serves one folder: every change to its code, manifest or
weights packs it again and deploys the new version (loaded, warmed and probed
like any deploy, then given all traffic at once). A change that breaks the
handler is reported and the last good version keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fnrt.functions.bundle import pack
from fnrt.functions.errors import FnrtError
from fnrt.functions.manifest import load_manifest
from fnrt.functions.version import VersionManifest
from fnrt.loader.repository import Repository
from fnrt.runtime.node import Node

log = logging.getLogger("fnrt.dev")

#: How long the folder must stay quiet before a change is deployed (an editor's save
#: can be several writes).
DEBOUNCE_MS = 50


@dataclass(frozen=True)
class Reload:
    """The outcome of one redeploy: the version now serving, or the error."""

    version: str | None
    error: str | None
    took_s: float


def _publish(repository: Repository, folder: Path) -> VersionManifest:
    manifest = load_manifest(folder)
    bundle = pack(folder, manifest)
    for ref, source in bundle.blob_sources():
        repository.put_blob(ref.digest, source)
    return VersionManifest(manifest, bundle.code_ref, bundle.artifacts)


async def redeploy(node: Node, folder: Path) -> Reload:
    """Pack ``folder`` and deploy it at once; the error (not raised) if that fails."""
    started = time.perf_counter()
    try:
        vm = await asyncio.to_thread(_publish, node.repository, folder)
        deployed = await node.deployer.deploy(vm, policy="immediate")
    except FnrtError as exc:
        return Reload(None, exc.message, time.perf_counter() - started)
    except Exception as exc:  # a broken file of any kind must not stop the loop
        return Reload(None, f"{type(exc).__name__}: {exc}", time.perf_counter() - started)
    return Reload(deployed.version, None, time.perf_counter() - started)


async def watch(
    node: Node,
    folder: Path,
    report: Callable[[Reload], None],
    stop: asyncio.Event | None = None,
) -> None:
    """Deploy ``folder`` now, then again after every change, until ``stop`` is set."""
    from watchfiles import awatch

    report(await redeploy(node, folder))
    async for _ in awatch(folder, debounce=DEBOUNCE_MS, step=DEBOUNCE_MS, stop_event=stop):
        report(await redeploy(node, folder))
