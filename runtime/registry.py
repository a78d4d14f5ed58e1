"""The functions a node serves: their routing, and a scheduler per version in use.

A function is found in the store the first time it is asked for, so a node
serves whatever the store holds without being told; any stored version can
also be served by its id. Each request goes to a version chosen by the
function's traffic split (random, or by a sticky header's hash). A deploy
through this node prepares the new version (blue/green: load, warm-up, probe)
before it gets traffic, then moves traffic at once or as a canary. Routing
written by other nodes is noticed by polling the store. A version that leaves
the routing keeps its instance for the rollback window, finishing what it
accepted; a background sweep scales idle instances to zero and closes
versions whose window has passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Mapping
from typing import Any

from fnrt.functions.errors import (
    CircuitOpen,
    Conflict,
    FunctionNotFound,
    VersionRetired,
)
from fnrt.functions.handler import Request
from fnrt.functions.manifest import NAME_PATTERN
from fnrt.functions.routing import Routing
from fnrt.functions.version import VersionManifest
from fnrt.loader.cache import choose_evictions
from fnrt.loader.instance import InstanceLoader
from fnrt.loader.repository import Repository, now_iso
from fnrt.runtime.clock import Clock
from fnrt.runtime.deployment import Deployed, cut_over, store_version
from fnrt.runtime.prewarm.keeper import Keeper
from fnrt.runtime.prewarm.policies import Policy
from fnrt.runtime.queue import Priority
from fnrt.runtime.result_cache import inputs_key
from fnrt.runtime.rollout import Canary, prepare
from fnrt.runtime.scheduler import Admission, Scheduler, Served
from fnrt.runtime.served import ServedFunction
from fnrt.runtime.split import Splits
from fnrt.runtime.traffic import bucket_of, choose_version
from fnrt.tracing.metrics import FunctionState
from fnrt.tracing.telemetry import Telemetry

log = logging.getLogger("fnrt.registry")

#: How often the keep-alive histories are written to the cache folder.
HISTORY_SAVE_INTERVAL_S = 60.0


class Registry:
    """Maps function names to their routing and the schedulers of their versions."""

    def __init__(
        self,
        repository: Repository,
        loader: InstanceLoader,
        clock: Clock,
        *,
        sweep_interval_s: float = 1.0,
        watch_interval_s: float = 1.0,
        memory_budget_bytes: int | None = None,
        max_queued_total: int = 10_000,
    ) -> None:
        self.memory_budget_bytes = memory_budget_bytes
        self.admission = Admission(max_queued_total)
        self.repository = repository
        self.loader = loader
        self.clock = clock
        self._sweep_interval_s = sweep_interval_s
        self._watch_interval_s = watch_interval_s
        self._functions: dict[str, ServedFunction] = {}
        self._lock = asyncio.Lock()
        self._loops: list[asyncio.Task[None]] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self.telemetry: Telemetry | None = None  # set by the app before serving
        self.keeper: Keeper | None = None  # keep-alive policies' histories (set by the app)
        self._saved_at = 0.0
        self.splits = Splits(self)  # the tails edge devices send activations to

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
        self._loops = [
            asyncio.ensure_future(self._every(self._sweep_interval_s, self.sweep)),
            asyncio.ensure_future(self._every(self._watch_interval_s, self.watch)),
        ]

    async def close(self) -> None:
        for loop in self._loops:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop
        for entry in self._functions.values():
            if entry.canary is not None:
                await entry.canary.cancel("the server is stopping")
        if self.keeper is not None:
            await asyncio.to_thread(self.keeper.save)
        schedulers = self.loaded()
        self._functions = {}
        await self.splits.close()
        await asyncio.gather(*(s.close() for s in schedulers), *self._tasks, return_exceptions=True)

    # --- finding versions --------------------------------------------------------------

    async def _entry(self, name: str) -> ServedFunction:
        entry = self._functions.get(name)
        if entry is not None:
            return entry
        if not NAME_PATTERN.match(name):
            raise FunctionNotFound(name)
        async with self._lock:
            entry = self._functions.get(name)
            if entry is not None:
                return entry
            routing, etag = await asyncio.to_thread(self.repository.get_routing, name)
            schedulers = {}
            for version in routing.traffic:
                vm = await asyncio.to_thread(self.repository.get_version, name, version)
                schedulers[version] = self._scheduler(vm)
            entry = self._functions[name] = ServedFunction(name, routing, etag, schedulers)
            return entry

    async def get(self, name: str) -> Scheduler:
        """The scheduler of the version with the largest share of ``name``'s traffic."""
        return (await self._entry(name)).primary

    async def route(self, name: str, headers: Mapping[str, str] | None = None) -> Scheduler:
        """The scheduler that answers this request, chosen by the traffic split.

        With a ``sticky_header`` in the primary version's manifest, the header's
        value picks the version (one user, one version); otherwise a random draw.
        """
        entry = await self._entry(name)
        traffic = entry.routing.traffic
        if len(traffic) == 1:
            return entry.primary
        sticky = entry.primary.version.manifest.rollout.sticky_header
        key = headers.get(sticky.lower()) if sticky and headers is not None else None
        return entry.schedulers[choose_version(traffic, bucket_of(key))]

    async def get_version(self, name: str, version: str) -> Scheduler:
        """The scheduler of one stored version of ``name``, whatever the routing says.

        Raises FunctionNotFound or VersionNotFound.
        """
        entry = await self._entry(name)
        scheduler = entry.schedulers.get(version)
        if scheduler is not None and not scheduler.closing:
            return scheduler
        vm = await asyncio.to_thread(self.repository.get_version, name, version)
        return self._held(entry, vm)

    def _held(self, entry: ServedFunction, vm: VersionManifest) -> Scheduler:
        """The open scheduler ``entry`` holds for ``vm``, made if there is none."""
        scheduler = entry.schedulers.get(vm.version)
        if scheduler is None or scheduler.closing:
            scheduler = entry.schedulers[vm.version] = self._scheduler(vm)
        return scheduler

    async def version_manifest(self, name: str, version: str | None = None) -> VersionManifest:
        """The routed version of ``name``, or the stored version ``version``; nothing loads."""
        entry = await self._entry(name)
        if version is None:
            return entry.primary.version
        held = entry.schedulers.get(version)
        if held is not None:
            return held.version
        return await asyncio.to_thread(self.repository.get_version, name, version)

    async def stored_versions(self, name: str) -> list[str]:
        """Every version id of ``name`` in the store; FunctionNotFound if it has none."""
        await self._entry(name)
        return await asyncio.to_thread(self.repository.list_versions, name)

    def _scheduler(self, vm: VersionManifest) -> Scheduler:
        scheduler = Scheduler(
            vm, self.loader, self.clock, self.make_room, self.admission, self.telemetry
        )
        if vm.manifest.scaling.min_instances > 0:
            self._background(_warm_logged(scheduler))
        return scheduler

    # --- serving -------------------------------------------------------------------------

    async def submit(
        self,
        scheduler: Scheduler,
        inputs: Request,
        *,
        priority: Priority | None = None,
        timeout_s: float | None = None,
        span: Any = None,
    ) -> tuple[Scheduler, Served]:
        """Answer ``inputs`` on ``scheduler``, or on its fallback while its breaker is open.

        Returns the scheduler that answered (the fallback function's, when that
        answered) and the result. A version that stopped taking requests
        between routing and submitting (it left the routing) hands the request
        to the function's current primary.
        """
        if self.keeper is not None:
            self.keeper.invoked(scheduler.name)
        if not scheduler.breaker.allow(self.clock.now()):
            return await self._fallback(scheduler, inputs, priority, timeout_s, span)
        try:
            return scheduler, await scheduler.submit(
                inputs, priority=priority, timeout_s=timeout_s, span=span
            )
        except VersionRetired:
            successor = await self.get(scheduler.name)
            if successor is scheduler:
                raise
            return successor, await successor.submit(
                inputs, priority=priority, timeout_s=timeout_s, span=span
            )

    async def _fallback(
        self,
        scheduler: Scheduler,
        inputs: Request,
        priority: Priority | None,
        timeout_s: float | None,
        span: Any,
    ) -> tuple[Scheduler, Served]:
        config = scheduler.version.manifest.breaker
        if scheduler.last_results is not None:
            hit = scheduler.last_results.get(inputs_key(inputs))
            if hit is not None:
                return scheduler, Served(hit, cached=True, fallback="cache")
        target = config.fallback_function
        if target is not None and target != scheduler.name:
            other = await self.route(target)
            if other.breaker.allow(self.clock.now()):
                served = await other.submit(
                    inputs, priority=priority, timeout_s=timeout_s, span=span
                )
                return other, Served(served.outputs, served.cold_tier, fallback=config.fallback)
        breaker = scheduler.breaker
        wait_s = max(breaker.opened_at + config.open_s - self.clock.now(), 1.0)
        raise CircuitOpen(scheduler.name, scheduler.version.version, wait_s)

    # --- deploying and moving traffic ----------------------------------------------------

    async def deploy(self, vm: VersionManifest, *, policy: str | None = None) -> Deployed:
        """Store ``vm``, prepare it (blue/green) and move traffic to it.

        ``policy`` overrides the manifest's ``rollout.policy``. The first version
        of a function with no warm-up or probe is routed at once and loads on
        its first request. Raises DeployRejected (routing untouched) when the
        version fails to load, warm up or pass its probe, or cannot be cut at
        its split points.
        """
        created, vm = await asyncio.to_thread(store_version, self.repository, self.loader, vm)
        if vm.manifest.split.enabled:
            await self.splits.check(vm)  # the cuts and heads ready before any device asks
        try:
            entry: ServedFunction | None = await self._entry(vm.name)
        except FunctionNotFound:
            entry = None
        config = vm.manifest.rollout
        if entry is not None and entry.routing.traffic == {vm.version: 100}:
            return Deployed(vm.name, vm.version, created, entry.routing, rollout="unchanged")
        checks: dict[str, Any] = {}
        if entry is not None or config.warmup_file or config.probe_file:
            candidate = self._held(entry, vm) if entry is not None else self._scheduler(vm)
            try:
                checks = await prepare(candidate, self.loader)
            except Exception:
                if entry is None or vm.version not in entry.routing.traffic:
                    if entry is not None:
                        entry.schedulers.pop(vm.version, None)
                    self._background(candidate.close())
                raise
            if entry is None:  # first version: routed below, with its instance
                routing = await asyncio.to_thread(cut_over, self.repository, vm)
                entry = await self._entry(vm.name)
                spare = entry.schedulers.get(vm.version)
                entry.schedulers[vm.version] = candidate
                if spare is not None and spare is not candidate:
                    self._background(spare.close())
                return Deployed(vm.name, vm.version, created, routing, checks=checks)
        chosen = policy or config.policy
        if entry is None:
            routing = await asyncio.to_thread(cut_over, self.repository, vm)
            await self._entry(vm.name)
            return Deployed(vm.name, vm.version, created, routing, checks=checks)
        if entry.canary is not None:
            await entry.canary.cancel(f"version {vm.version} was deployed")
        baseline = entry.primary
        if chosen == "canary" and baseline.version.version != vm.version:
            canary = Canary(
                baseline,
                entry.schedulers[vm.version],
                config,
                self.clock,
                lambda traffic, _: self._canary_step(entry, canary, traffic),
            )
            entry.canary = canary
            canary.start()
            entry.last_rollout = canary.status
            return Deployed(
                vm.name, vm.version, created, entry.routing, rollout="canary", checks=checks
            )
        routing = await self._write(entry, lambda r: r.cut_over(vm.version, now_iso()))
        entry.last_rollout = {"policy": "immediate", "to": vm.version, "state": "done"}
        return Deployed(vm.name, vm.version, created, routing, checks=checks)

    async def _canary_step(
        self, entry: ServedFunction, canary: Canary, traffic: dict[str, int]
    ) -> bool:
        if entry.canary is not canary or self._functions.get(entry.name) is not entry:
            return False
        new = canary.candidate.version.version
        if traffic.get(new, 0) == 0:  # rolled back: the failed version leaves no history
            await self._write(
                entry,
                lambda r: Routing(
                    traffic=traffic,
                    previous=tuple(v for v in r.with_traffic(traffic, "").previous if v != new),
                    updated_at=now_iso(),
                ),
            )
        else:
            await self._write(entry, lambda r: r.with_traffic(traffic, now_iso()))
        return True

    async def set_traffic(self, name: str, traffic: Mapping[str, int]) -> Routing:
        """A split set by hand (``fnrt traffic``); stops a canary under way."""
        entry = await self._entry(name)
        for version in traffic:
            await asyncio.to_thread(self.repository.get_version, name, version)
        if entry.canary is not None:
            await entry.canary.cancel("the traffic was set by hand")
        shares = {str(v): int(p) for v, p in traffic.items()}
        Routing(shares)  # validates: shares are percentages summing to 100
        return await self._write(entry, lambda r: r.with_traffic(shares, now_iso()))

    async def rollback(self, name: str) -> Routing:
        """All traffic back to the version served before the last cut-over.

        Instant while that version is still loaded (within its rollback
        window); otherwise it loads from the disk cache on its next request.
        """
        entry = await self._entry(name)
        canary = entry.canary
        if canary is not None and canary.task is not None and not canary.task.done():
            await canary.cancel("rolled back by hand")  # back to the version it started from
            base = canary.baseline.version.version
            await self._canary_step(entry, canary, {base: 100})
            entry.canary = None
            canary.status.update(state="rolled_back", reason="rolled back by hand", percent=0)
            return entry.routing
        if not entry.routing.previous:
            raise Conflict(f"'{name}' has no earlier version to roll back to")
        return await self._write(entry, lambda r: r.rolled_back(now_iso()))

    async def _write(self, entry: ServedFunction, change: Any) -> Routing:
        """Apply ``change`` to the stored routing (a conditional write), then here."""
        repository = self.repository

        def write() -> Routing:
            return repository.update_routing(
                entry.name, lambda current: change(current or entry.routing)
            )

        await asyncio.to_thread(write)
        await self._refresh(entry)
        return entry.routing

    async def _refresh(self, entry: ServedFunction) -> bool:
        """Serve the stored routing here if it changed; whether it did.

        The read happens under the lock, so a slow read (a watch poll) can never
        apply an older routing over a newer one a write here applied meanwhile.
        """
        async with self._lock:
            routing, etag = await asyncio.to_thread(self.repository.get_routing, entry.name)
            if etag == entry.etag:
                return False
            await self._apply(entry, routing, etag)
            return True

    async def _apply(self, entry: ServedFunction, routing: Routing, etag: str) -> None:
        """Serve ``routing`` here: schedulers for versions with traffic, the rest retiring.

        Called with the lock held.
        """
        for version in routing.traffic:
            if version not in entry.schedulers or entry.schedulers[version].closing:
                vm = await asyncio.to_thread(self.repository.get_version, entry.name, version)
                scheduler = self._held(entry, vm)
                if routing.traffic[version]:  # traffic is on its way: load it now
                    self._background(_warm_logged(scheduler))
            entry.left_at.pop(version, None)
        now = self.clock.now()
        for version in entry.routing.traffic:
            if version not in routing.traffic:
                entry.left_at[version] = now
        if entry.routing.primary != routing.primary:
            log.info("%s: %s now serves %s", entry.name, routing.primary, dict(routing.traffic))
        entry.routing, entry.etag = routing, etag

    async def watch(self) -> list[str]:
        """Pick up routing that changed in the store (another node's deploy); names changed."""
        changed = []
        for entry in list(self._functions.values()):
            try:
                if await self._refresh(entry):
                    changed.append(entry.name)
            except FunctionNotFound:
                await self._forget(entry.name)
                changed.append(entry.name)
        return changed

    async def delete(self, name: str) -> None:
        await asyncio.to_thread(self.repository.delete_function, name)
        await self._forget(name)

    async def _forget(self, name: str) -> None:
        entry = self._functions.pop(name, None)
        if entry is None:
            return
        if entry.canary is not None:
            await entry.canary.cancel("the function was deleted")
        await asyncio.gather(*(s.close() for s in entry.schedulers.values()))

    # --- describing ------------------------------------------------------------------

    async def describe(self, name: str) -> dict[str, Any]:
        entry = await self._entry(name)
        scheduler = entry.primary
        versions = await asyncio.to_thread(self.repository.list_versions, name)
        manifest = scheduler.version.manifest
        return {
            "name": name,
            "version": scheduler.version.version,
            "description": manifest.description,
            "size_bytes": scheduler.version.size_bytes,
            "manifest": manifest.to_dict(),
            "instance": scheduler.describe(),
            "traffic": dict(entry.routing.traffic),
            "previous": list(entry.routing.previous),
            "rollout": entry.last_rollout,
            "versions": versions,
            "keep_alive": {
                "policy": manifest.scaling.keep_alive_policy,
                **(self.keeper.planned(name) if self.keeper is not None else {}),
            },
        }

    async def versions(self, name: str) -> dict[str, Any]:
        """Every stored version with its share, state here and breaker; the rollout."""
        entry = await self._entry(name)
        stored = await asyncio.to_thread(self.repository.list_versions, name)
        manifests = {}
        for version in stored:
            try:
                manifests[version] = await self.version_manifest(name, version)
            except Exception:
                continue
        return entry.listing(manifests, self.clock.now())

    async def failures(self, name: str, version: str | None = None) -> list[dict[str, Any]]:
        """The kept failed requests of ``name`` (one version, or all), newest first."""
        return (await self._entry(name)).failures(version)

    async def summaries(self) -> list[dict[str, Any]]:
        """Name, serving version, state and description of every function."""
        names = await asyncio.to_thread(self.repository.list_functions)
        out = []
        for name in names:
            try:
                entry = await self._entry(name)
            except FunctionNotFound:
                continue  # deleted meanwhile
            scheduler = entry.primary
            out.append(
                {
                    "name": name,
                    "version": scheduler.version.version,
                    "state": scheduler.state.value,
                    "traffic": dict(entry.routing.traffic),
                    "description": scheduler.version.manifest.description,
                }
            )
        return out

    def loaded(self) -> list[Scheduler]:
        """Every scheduler on this node: primary versions first."""
        primaries = [e.primary for e in self._functions.values()]
        rest = [
            s for e in self._functions.values() for s in e.schedulers.values() if s is not e.primary
        ]
        return [*primaries, *rest, *self.splits.schedulers()]

    def function_states(self) -> list[FunctionState]:
        """Warm instances and queue depth of every version held here (for /metrics)."""
        return [
            FunctionState(s.name, s.version.version, s.instances, s.queued) for s in self.loaded()
        ]

    def versions_of(self, name: str) -> list[Scheduler]:
        """The schedulers this node has for ``name`` (the primary first)."""
        entry = self._functions.get(name)
        if entry is None:
            return []
        return [entry.primary, *(s for s in entry.schedulers.values() if s is not entry.primary)]

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
        """Scale idle instances to zero as their keep-alive policies say, pre-warm those
        whose next call is predicted, and close versions whose rollback window passed
        (they finish what they accepted); names unloaded."""
        now = self.clock.now()
        unloaded = []
        for entry in list(self._functions.values()):
            window = entry.primary.version.manifest.rollout.rollback_window_s
            for version, left in list(entry.left_at.items()):
                scheduler = entry.schedulers.get(version)
                if now - left >= window:
                    del entry.left_at[version]
                    if scheduler is not None and version not in entry.routing.traffic:
                        del entry.schedulers[version]
                        self._background(scheduler.close())
                        unloaded.append(entry.name)
            for version, scheduler in list(entry.schedulers.items()):
                if version in entry.left_at:
                    continue  # kept warm for a rollback
                learned = self.keeper is not None and scheduler is entry.primary
                policy = Policy(scheduler.version.manifest.scaling.keep_alive_policy)
                learned = learned and policy is not Policy.FIXED
                if await scheduler.scale_to_zero(now, keep_primary=learned):
                    unloaded.append(scheduler.name)
                if learned and await self._keep(scheduler, policy, now):
                    unloaded.append(scheduler.name)
        held = {(e.name, v) for e in self._functions.values() for v in e.schedulers}
        unloaded += await self.splits.sweep(now, held)
        if self.keeper is not None and now - self._saved_at >= HISTORY_SAVE_INTERVAL_S:
            self._saved_at = now
            await asyncio.to_thread(self.keeper.save)
        return unloaded

    async def _keep(self, scheduler: Scheduler, policy: Policy, now: float) -> bool:
        """Act on the keeper's plan for a function's first instance; True if unloaded."""
        assert self.keeper is not None
        activity = scheduler.activity()
        if activity.busy or activity.queued:
            return False
        scaling = scheduler.version.manifest.scaling
        if activity.loaded and scheduler.instances <= scaling.min_instances:
            return False
        idle_for = max(now - activity.last_active_s, 0.0)
        action = self.keeper.act(
            scheduler.name,
            policy,
            keep_alive_s=scaling.keep_alive_s,
            idle_since_unix=self.keeper.wall() - idle_for,
            loaded=activity.loaded,
        )
        if action.unload:
            return await scheduler.scale_to_zero(now, force=True)
        if action.prewarm:
            self._background(self._prewarm(scheduler))
        return False

    async def _prewarm(self, scheduler: Scheduler) -> None:
        """Load ahead of a predicted call, only into memory nobody else is using: when it
        does not fit the budget, only fetch its files into the disk cache."""
        needed = scheduler.stats.last_load_bytes or scheduler.version.size_bytes
        used = sum(s.instance_bytes for s in self.loaded())
        try:
            if self.memory_budget_bytes is None or used + needed <= self.memory_budget_bytes:
                if await scheduler.prewarm():
                    log.info("pre-warmed %s ahead of its predicted call", scheduler.name)
            else:
                await asyncio.to_thread(self.loader.prefetch, scheduler.version)
        except Exception as exc:
            log.warning("pre-warming %s failed: %s", scheduler.name, exc)

    async def _every(self, interval_s: float, work: Any) -> None:
        while True:
            await self.clock.sleep(interval_s)
            try:
                await work()
            except Exception:
                log.exception("%s failed", work.__name__)


def _key(scheduler: Scheduler) -> str:
    return f"{scheduler.name}/{scheduler.version.version}"


async def _warm_logged(scheduler: Scheduler) -> None:
    try:
        await scheduler.warm()
    except Exception as exc:
        log.error("preloading %s failed: %s", scheduler.name, exc)
