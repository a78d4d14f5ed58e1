"""The functions a node serves: one scheduler per function, kept in step with the store.

A function is found in the store the first time it is asked for, so a node
serves whatever the store holds without being told; any stored version can
also be served by its id. Deploys through this node
publish to the store and swap the scheduler at once; the old version finishes
what it had queued and unloads. A background sweep scales idle instances to zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

from fnrt.functions.errors import FunctionNotFound
from fnrt.functions.manifest import NAME_PATTERN
from fnrt.functions.version import VersionManifest
from fnrt.loader.cache import choose_evictions
from fnrt.loader.instance import InstanceLoader
from fnrt.loader.repository import Repository
from fnrt.runtime.clock import Clock
from fnrt.runtime.deployment import Deployed, publish_version
from fnrt.runtime.scheduler import Admission, Scheduler

log = logging.getLogger("fnrt.registry")


class Registry:
    """Maps function names to the schedulers of their versions.

    Each function has the version its routing sends traffic to (``get``) and
    any other stored version asked for by id (``get_version``, for
    ``/v2/models/{m}/versions/{v}``), each with its own scheduler, created on
    first use and loaded lazily like any other.
    """

    def __init__(
        self,
        repository: Repository,
        loader: InstanceLoader,
        clock: Clock,
        *,
        sweep_interval_s: float = 1.0,
        memory_budget_bytes: int | None = None,
        max_queued_total: int = 10_000,
    ) -> None:
        self.memory_budget_bytes = memory_budget_bytes
        self.admission = Admission(max_queued_total)
        self.repository = repository
        self.loader = loader
        self.clock = clock
        self._sweep_interval_s = sweep_interval_s
        self._routed: dict[str, Scheduler] = {}  # name -> the version routing serves
        self._pinned: dict[tuple[str, str], Scheduler] = {}  # (name, version) asked by id
        self._lock = asyncio.Lock()
        self._sweeper: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    def _background(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` without awaiting it, holding a reference until it ends."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def start(self, *, preload: bool = False) -> None:
        """Read every function's routing; load those that ask to start warm."""
        names = await asyncio.to_thread(self.repository.list_functions)
        for name in names:
            try:
                scheduler = await self.get(name)
            except Exception as exc:  # one broken function must not stop the node
                log.error("cannot serve %s: %s", name, exc)
                continue
            if preload or scheduler.version.manifest.scaling.load_at_start:
                self._background(_warm_logged(scheduler))
        self._sweeper = asyncio.ensure_future(self._sweep_forever())

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        schedulers = self.loaded()
        self._routed, self._pinned = {}, {}
        await asyncio.gather(*(s.close() for s in schedulers), *self._tasks, return_exceptions=True)

    async def get(self, name: str) -> Scheduler:
        """The scheduler serving ``name``; reads the store if this node has none yet."""
        scheduler = self._routed.get(name)
        if scheduler is not None:
            return scheduler
        if not NAME_PATTERN.match(name):
            raise FunctionNotFound(name)
        async with self._lock:
            scheduler = self._routed.get(name)
            if scheduler is not None:
                return scheduler
            routing, _ = await asyncio.to_thread(self.repository.get_routing, name)
            vm = await asyncio.to_thread(self.repository.get_version, name, routing.primary)
            return self._activate(vm)

    async def get_version(self, name: str, version: str) -> Scheduler:
        """The scheduler of one stored version of ``name``, whatever the routing says.

        Raises FunctionNotFound or VersionNotFound.
        """
        routed = await self.get(name)
        if routed.version.version == version:
            return routed
        scheduler = self._pinned.get((name, version))
        if scheduler is not None:
            return scheduler
        vm = await asyncio.to_thread(self.repository.get_version, name, version)
        async with self._lock:
            scheduler = self._pinned.get((name, version))
            if scheduler is None:
                scheduler = self._pinned[(name, version)] = self._scheduler(vm)
            return scheduler

    async def version_manifest(self, name: str, version: str | None = None) -> VersionManifest:
        """The routed version of ``name``, or the stored version ``version``; nothing loads."""
        routed = await self.get(name)
        if version is None or routed.version.version == version:
            return routed.version
        pinned = self._pinned.get((name, version))
        if pinned is not None:
            return pinned.version
        return await asyncio.to_thread(self.repository.get_version, name, version)

    async def stored_versions(self, name: str) -> list[str]:
        """Every version id of ``name`` in the store; FunctionNotFound if it has none."""
        await self.get(name)
        return await asyncio.to_thread(self.repository.list_versions, name)

    def _scheduler(self, vm: VersionManifest) -> Scheduler:
        scheduler = Scheduler(vm, self.loader, self.clock, self.make_room, self.admission)
        if vm.manifest.scaling.min_instances > 0:
            self._background(_warm_logged(scheduler))
        return scheduler

    def _activate(self, vm: VersionManifest) -> Scheduler:
        old = self._routed.get(vm.name)
        if old is not None and old.version.version == vm.version:
            return old
        # A version served by id so far becomes the routed one, instances and all.
        scheduler = self._pinned.pop((vm.name, vm.version), None) or self._scheduler(vm)
        self._routed[vm.name] = scheduler
        if old is not None:
            self._background(old.close())
        return scheduler

    async def deploy(self, vm: VersionManifest) -> Deployed:
        """Validate, publish and switch to ``vm`` (see :func:`publish_version`)."""
        deployed = await asyncio.to_thread(publish_version, self.repository, self.loader, vm)
        async with self._lock:
            self._activate(vm)
        return deployed

    async def delete(self, name: str) -> None:
        await asyncio.to_thread(self.repository.delete_function, name)
        schedulers = [self._routed.pop(name, None)]
        schedulers += [self._pinned.pop(key) for key in list(self._pinned) if key[0] == name]
        await asyncio.gather(*(s.close() for s in schedulers if s is not None))

    async def describe(self, name: str) -> dict[str, Any]:
        scheduler = await self.get(name)
        versions = await asyncio.to_thread(self.repository.list_versions, name)
        routing, _ = await asyncio.to_thread(self.repository.get_routing, name)
        manifest = scheduler.version.manifest
        return {
            "name": name,
            "version": scheduler.version.version,
            "description": manifest.description,
            "size_bytes": scheduler.version.size_bytes,
            "manifest": manifest.to_dict(),
            "instance": scheduler.describe(),
            "traffic": dict(routing.traffic),
            "versions": versions,
        }

    async def summaries(self) -> list[dict[str, Any]]:
        """Name, serving version, state and description of every function."""
        names = await asyncio.to_thread(self.repository.list_functions)
        out = []
        for name in names:
            try:
                scheduler = await self.get(name)
            except FunctionNotFound:
                continue  # deleted meanwhile
            out.append(
                {
                    "name": name,
                    "version": scheduler.version.version,
                    "state": scheduler.state.value,
                    "description": scheduler.version.manifest.description,
                }
            )
        return out

    def loaded(self) -> list[Scheduler]:
        """Every scheduler on this node: routed versions, then versions served by id."""
        return [*self._routed.values(), *self._pinned.values()]

    def versions_of(self, name: str) -> list[Scheduler]:
        """The schedulers this node has for ``name`` (routed first)."""
        routed = self._routed.get(name)
        pinned = [s for (n, _), s in self._pinned.items() if n == name]
        return [routed, *pinned] if routed is not None else pinned

    async def make_room(self, loading: Scheduler, needed_bytes: int) -> None:
        """Unload least-recently-used idle instances so ``needed_bytes`` fits the budget.

        Busy instances (running, loading or with a queue) are never evicted; if
        they alone fill the budget the load goes ahead over it.
        """
        if self.memory_budget_bytes is None:
            return
        others = [s for s in self.loaded() if s is not loading and s.instance_bytes]
        others.sort(key=lambda s: s.activity().last_active_s)
        busy = {_key(s) for s in others if s.activity().busy or s.activity().queued}
        victims = choose_evictions(
            self.memory_budget_bytes,
            needed_bytes,
            [(_key(s), s.instance_bytes) for s in others],
            busy,
        )
        now = self.clock.now()
        for scheduler in others:
            if _key(scheduler) in victims:
                log.info("evicting %s to make room for %s", _key(scheduler), _key(loading))
                await scheduler.scale_to_zero(now, force=True)

    async def sweep(self) -> list[str]:
        """Scale every idle instance past its keep-alive to zero; names unloaded."""
        now = self.clock.now()
        unloaded = []
        for scheduler in self.loaded():
            if await scheduler.scale_to_zero(now):
                unloaded.append(scheduler.name)
        return unloaded

    async def _sweep_forever(self) -> None:
        while True:
            await self.clock.sleep(self._sweep_interval_s)
            try:
                await self.sweep()
            except Exception:
                log.exception("scale-to-zero sweep failed")


def _key(scheduler: Scheduler) -> str:
    return f"{scheduler.name}/{scheduler.version.version}"


async def _warm_logged(scheduler: Scheduler) -> None:
    try:
        await scheduler.warm()
    except Exception as exc:
        log.error("preloading %s failed: %s", scheduler.name, exc)
