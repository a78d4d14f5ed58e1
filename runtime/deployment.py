"""Publishing a version: validate it, record it, and route traffic to it.

Shared by the server's deploy route and ``fnrt deploy --store`` (no server),
so both check the same things and write the store the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from fnrt.functions.errors import BlobNotFound
from fnrt.functions.routing import Routing
from fnrt.functions.version import VersionManifest
from fnrt.loader.instance import InstanceLoader
from fnrt.loader.repository import Repository, now_iso


@dataclass(frozen=True)
class Deployed:
    name: str
    version: str
    created: bool  # False when this exact content was deployed before
    routing: Routing


def publish_version(
    repository: Repository, loader: InstanceLoader, vm: VersionManifest
) -> Deployed:
    """Validate ``vm`` (blobs present, handler importable and to contract), store it,
    and give it all of the function's traffic. Blocking; nothing is loaded.

    Raises HandlerError, BlobNotFound or ManifestError before anything is written.
    """
    for ref in vm.blobs():
        if not repository.has_blob(ref.digest):
            raise BlobNotFound(ref.digest)
    loader.handler_object(vm)
    created = repository.put_version(vm)
    stamp = now_iso()
    routing = repository.update_routing(
        vm.name,
        lambda current: (
            Routing.first(vm.version, stamp)
            if current is None
            else current.cut_over(vm.version, stamp)
        ),
    )
    return Deployed(vm.name, vm.version, created, routing)
