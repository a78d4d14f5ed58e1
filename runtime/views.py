"""What the admin API and OIP's index show of the registry: read-only views.

The registry keeps the function table and routes requests; how a function, its
versions, its kept failures or a page of the store's functions look to an operator
is made here from what it holds and what the store says (DESIGN: a coordinator
does not also own its admin views).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fnrt.functions.errors import FunctionNotFound
from fnrt.functions.routing import Routing
from fnrt.loader.repository import Repository
from fnrt.runtime import scheduler as sched
from fnrt.runtime.registry import Registry
from fnrt.runtime.rollouts import Rollouts

log = logging.getLogger("fnrt.registry")


async def stored_versions(registry: Registry, name: str) -> list[str]:
    """Every version id of ``name`` in the store, for a public route (OIP's model
    metadata): listed again at most every 2 s, or once the function is written (the
    change feed names it, or this node wrote it: ``Lookups.versions``);
    FunctionNotFound if it has none."""
    await registry.entry(name, fresh=False)
    return await registry.lookups.versions(
        name, lambda: asyncio.to_thread(registry.repository.list_versions, name)
    )


async def describe(registry: Registry, name: str, rollouts: Rollouts) -> dict[str, Any]:
    """``GET /v1/functions/{name}``: the routed version, its instance, traffic, rollout."""
    entry = await registry.entry(name)
    scheduler = entry.primary
    versions = await asyncio.to_thread(registry.repository.list_versions, name)
    manifest = scheduler.version.manifest
    return {
        "name": name,
        "version": scheduler.version.version,
        "description": manifest.description,
        "size_bytes": scheduler.version.size_bytes,
        "manifest": manifest.to_dict(),
        "instance": sched.describe(scheduler),
        "traffic": dict(entry.routing.traffic),
        "previous": list(entry.routing.previous),
        "rollout": rollouts.view(name, entry.routing),
        "versions": versions,
        "keep_alive": {
            "policy": manifest.scaling.keep_alive_policy,
            **(registry.keeper.planned(name) if registry.keeper is not None else {}),
        },
    }


async def versions(registry: Registry, name: str, rollouts: Rollouts) -> dict[str, Any]:
    """Every stored version with its share, state here and breaker; the rollout."""
    entry = await registry.entry(name)
    stored = await asyncio.to_thread(registry.repository.list_versions, name)
    manifests = {}
    for version in stored:
        try:
            manifests[version] = await registry.version_manifest(name, version)
        except Exception:
            continue
    return entry.listing(manifests, registry.clock.now(), rollouts.view(name, entry.routing))


async def failures(
    registry: Registry, name: str, version: str | None = None
) -> list[dict[str, Any]]:
    """The kept failed requests of ``name`` (one version, or all), newest first."""
    return (await registry.entry(name)).failures(version)


async def summaries(
    registry: Registry, limit: int | None = None, after: str = ""
) -> tuple[list[dict[str, Any]], str | None]:
    """Name, serving version, state and description of the ``limit`` functions after
    ``after`` (all: None), and the name to list after next (None at the end). A
    function this node has not served yet is read, not loaded: it is cold."""
    names = await asyncio.to_thread(
        registry.repository.list_functions, after, None if limit is None else limit + 1
    )
    more = limit is not None and len(names) > limit
    names = names[:limit] if limit is not None else names
    held = {entry.name: entry for entry in registry.entries()}
    unread = [n for n in names if n not in held]
    read = await asyncio.to_thread(_read_serving, registry.repository, unread) if unread else {}
    out = []
    for name in names:
        entry = held.get(name)
        if entry is not None:
            vm = entry.primary.version
            summary = (vm.version, entry.primary.pool.state.value, entry.routing.traffic)
            description = vm.manifest.description
        elif name in read:
            routing, stored = read[name]
            summary = (routing.primary, "cold", routing.traffic)
            description = str(stored["manifest"].get("description", ""))
        else:
            continue  # deleted meanwhile, or unreadable
        version, state, traffic = summary
        out.append(
            {
                "name": name,
                "version": version,
                "state": state,
                "traffic": dict(traffic),
                "description": description,
            }
        )
    return out, (names[-1] if more and names else None)


def _read_serving(
    repository: Repository, names: list[str]
) -> dict[str, tuple[Routing, dict[str, Any]]]:
    """Each function's routing and serving version as stored (blocking; a few
    threads, so a page over S3 waits for a few round trips, not one per read)."""

    def read(name: str) -> tuple[Routing, dict[str, Any]] | None:
        try:
            routing, _ = repository.get_routing(name)
            return routing, repository.read_version(name, routing.primary)
        except FunctionNotFound:
            return None  # deleted meanwhile
        except Exception as exc:  # one unreadable function must not fail the listing
            log.warning("cannot list %s: %s", name, exc)
            return None

    with ThreadPoolExecutor(min(8, len(names)), thread_name_prefix="fnrt-list") as pool:
        found = dict(zip(names, pool.map(read, names), strict=True))
    return {name: got for name, got in found.items() if got is not None}
