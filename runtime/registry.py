"""The functions a node serves: one scheduler per function, kept in step with the store.

A function is found in the store the first time it is asked for, so a node
serves whatever the store holds without being told. Deploys through this node
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
    """Maps function names to the scheduler of the version that serves them."""

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
        self._schedulers: dict[str, Scheduler] = {}
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
        schedulers, self._schedulers = list(self._schedulers.values()), {}
        await asyncio.gather(*(s.close() for s in schedulers), *self._tasks, return_exceptions=True)

    async def get(self, name: str) -> Scheduler:
        """The scheduler serving ``name``; reads the store if this node has none yet."""
        scheduler = self._schedulers.get(name)
        if scheduler is not None:
            return scheduler
        if not NAME_PATTERN.match(name):
            raise FunctionNotFound(name)
        async with self._lock:
            scheduler = self._schedulers.get(name)
            if scheduler is not None:
                return scheduler
            routing, _ = await asyncio.to_thread(self.repository.get_routing, name)
            vm = await asyncio.to_thread(self.repository.get_version, name, routing.primary)
            return self._activate(vm)

    def _activate(self, vm: VersionManifest) -> Scheduler:
        old = self._schedulers.get(vm.name)
        if old is not None and old.version.version == vm.version:
            return old
        scheduler = Scheduler(vm, self.loader, self.clock, self.make_room, self.admission)
        if vm.manifest.scaling.min_instances > 0:
            self._background(_warm_logged(scheduler))
        self._schedulers[vm.name] = scheduler
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
        scheduler = self._schedulers.pop(name, None)
        if scheduler is not None:
            await scheduler.close()

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
        return list(self._schedulers.values())

    async def make_room(self, loading: Scheduler, needed_bytes: int) -> None:
        """Unload least-recently-used idle instances so ``needed_bytes`` fits the budget.

        Busy instances (running, loading or with a queue) are never evicted; if
        they alone fill the budget the load goes ahead over it.
        """
        if self.memory_budget_bytes is None:
            return
        others = [s for s in self._schedulers.values() if s is not loading and s.instance_bytes]
        others.sort(key=lambda s: s.activity().last_active_s)
        busy = {s.name for s in others if s.activity().busy or s.activity().queued}
        victims = choose_evictions(
            self.memory_budget_bytes,
            needed_bytes,
            [(s.name, s.instance_bytes) for s in others],
            busy,
        )
        now = self.clock.now()
        for scheduler in others:
            if scheduler.name in victims:
                log.info("evicting %s to make room for %s", scheduler.name, loading.name)
                await scheduler.scale_to_zero(now, force=True)

    async def sweep(self) -> list[str]:
        """Scale every idle instance past its keep-alive to zero; names unloaded."""
        now = self.clock.now()
        unloaded = []
        for scheduler in list(self._schedulers.values()):
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


async def _warm_logged(scheduler: Scheduler) -> None:
    try:
        await scheduler.warm()
    except Exception as exc:
        log.error("preloading %s failed: %s", scheduler.name, exc)
