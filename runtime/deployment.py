"""Publishing a version: validate it, record it, and route traffic to it.

Shared by the server's deploy route and ``fnrt deploy --store`` (no server),
so both check the same things and write the store the same way. The server
goes further (blue/green, canary: see :mod:`fnrt.runtime.rollout`); without a
server, a deploy moves all traffic at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fnrt.functions.errors import BlobNotFound
from fnrt.functions.routing import Routing
from fnrt.functions.version import VersionManifest
from fnrt.loader.imports import code_imports
from fnrt.loader.instance import InstanceLoader
from fnrt.loader.launch import check_in_environment
from fnrt.loader.repository import Repository, now_iso


@dataclass(frozen=True)
class Deployed:
    name: str
    version: str
    created: bool  # False when this exact content was deployed before
    routing: Routing
    rollout: str = "immediate"  # "immediate", "canary" (under way) or "unchanged"
    checks: dict[str, Any] = field(default_factory=dict)  # what the blue/green step ran


def store_version(
    repository: Repository, loader: InstanceLoader, vm: VersionManifest
) -> tuple[bool, VersionManifest]:
    """Validate ``vm`` (blobs present, handler importable and to contract) and store it,
    stamped with its creation time and the packages its code imports (what a node's
    spare workers import ahead of its first cold start). Blocking; nothing is loaded
    and no traffic moves.

    Returns whether it was new, and the version as stored. Raises HandlerError,
    BlobNotFound or ManifestError before anything is written.
    """
    for ref in vm.blobs():
        if not repository.has_blob(ref.digest):
            raise BlobNotFound(ref.digest)
    if vm.manifest.environment.enabled:  # its packages are not the server's: check it there
        check_in_environment(loader, vm)
    else:
        loader.handler_object(vm)
    imports = code_imports(loader.code_dir(vm), vm.manifest.module)  # for spare workers
    vm = vm.stamped(vm.created_at or now_iso(), imports)
    if repository.put_version(vm):
        return True, vm
    return False, repository.get_version(vm.name, vm.version)


def cut_over(repository: Repository, vm: VersionManifest) -> Routing:
    """Give ``vm`` all of its function's traffic (a conditional write)."""
    stamp = now_iso()
    return repository.update_routing(
        vm.name,
        lambda current: (
            Routing.first(vm.version, stamp)
            if current is None
            else current.cut_over(vm.version, stamp)
        ),
    )


def publish_version(
    repository: Repository, loader: InstanceLoader, vm: VersionManifest
) -> Deployed:
    """Store ``vm`` and give it all of the function's traffic at once (no server)."""
    created, vm = store_version(repository, loader, vm)
    return Deployed(vm.name, vm.version, created, cut_over(repository, vm))
