"""Deploying through this node and moving traffic: blue/green, canaries, hand-set splits.

A deploy stores the version (``deployment.store_version``), cuts its split
points if it has any, prepares it (load, warm-up, probe: ``rollout.prepare``)
before it gets traffic, then moves traffic at once or as a :class:`Canary`.
Every change of routing is a conditional write to the store, applied here
through the registry (other nodes pick it up from the store).

Before it answers, a deploy readies what the version's first call needs
(:meth:`Deployer.ready`): its files materialised and checked, and, when it runs
in worker processes, a spare worker that has imported what its code imports
and rehearsed a cold start (``SpareWorkers.ready_for``), waited for up to
``READY_TIMEOUT_S``. Its weights are not loaded: mapping them is the cheap part
of a cold start (milliseconds), and a loaded instance would hold a version that
may never be called; a spare serves whichever function is called first. A
deploy whose worker is not ready in time (or cannot start) still succeeds: its
``checks`` say so, and the first call starts a worker itself.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from fnrt.functions.errors import Conflict, FunctionNotFound
from fnrt.functions.manifest import DEFAULT_ISOLATION, IsolationMode
from fnrt.functions.routing import Routing
from fnrt.functions.version import VersionManifest
from fnrt.loader.instance import InstanceLoader
from fnrt.loader.repository import now_iso
from fnrt.runtime import scheduler as sched
from fnrt.runtime.clock import Clock
from fnrt.runtime.deployment import Deployed, cut_over, store_version
from fnrt.runtime.registry import Registry
from fnrt.runtime.rollout import (
    Canary,
    RolloutPolicy,
    RolloutState,
    RolloutStatus,
    prepare,
)
from fnrt.runtime.rollouts import Rollouts
from fnrt.runtime.served import ServedFunction
from fnrt.runtime.split import Splits

#: The longest a deploy waits for a worker ready for the version's first call (a spare
#: importing torch takes 1-3 s on two busy cores).
READY_TIMEOUT_S = 30.0
PROCESS = IsolationMode.PROCESS

log = logging.getLogger("fnrt.deploy")


class RoutingChanged(Conflict):
    """The stored routing is not the split a canary wrote last: changed elsewhere (the
    canary stops; raised inside its write, never answered)."""

    def __init__(self, traffic: dict[str, int]) -> None:
        super().__init__(f"the routing was changed elsewhere to {traffic}", traffic=traffic)
        self.traffic = traffic


class Deployer:
    """Deploys, canaries, traffic splits and rollbacks of the functions a node serves."""

    def __init__(
        self,
        registry: Registry,
        splits: Splits,
        loader: InstanceLoader,
        clock: Clock,
        *,
        isolation: IsolationMode = DEFAULT_ISOLATION,
        ready_timeout_s: float = READY_TIMEOUT_S,
    ) -> None:
        self._registry = registry
        self._splits = splits
        self._loader = loader
        self._clock = clock
        self._isolation = isolation  # where instances run unless a manifest says
        self._ready_timeout_s = ready_timeout_s
        #: the canary under way and the last rollout of each function: this part's alone
        self.rollouts = Rollouts()

    async def deploy(self, vm: VersionManifest, *, policy: str | None = None) -> Deployed:
        """Store ``vm``, prepare it (blue/green) and move traffic to it.

        ``policy`` overrides the manifest's ``rollout.policy``. The first version
        of a function with no warm-up or probe is routed at once and loads on
        its first request. Raises DeployRejected (routing untouched) when the
        version fails to load, warm up or pass its probe, or cannot be cut at
        its split points. Answers once the version's first call is readied
        (:meth:`ready`): ``checks["ready"]`` says how.
        """
        repository = self._registry.repository
        created, vm = await asyncio.to_thread(store_version, repository, self._loader, vm)
        if vm.manifest.split.enabled:
            await self._splits.check(vm)  # the cuts and heads ready before any device asks
        deployed = await self._routed(vm, created, policy)
        return replace(deployed, checks={**deployed.checks, "ready": await self.ready(vm)})

    async def ready(self, vm: VersionManifest) -> dict[str, Any]:
        """Ready what ``vm``'s first call needs, both bounded by ``ready_timeout_s``: its
        files in the disk cache (fetched and checked), and a spare worker importing what
        its code imports, warmed. What was readied: ``files`` is ``ready`` or ``not
        ready`` (in time: the fetch goes on; or it failed: logged); ``worker`` is
        ``ready``, ``not ready`` (in time, or it could not start) or ``none`` (its
        instances run in a thread here, it has an ``[environment]``, or the node keeps
        no spares); ``seconds``."""
        start = time.monotonic()
        fetched = asyncio.ensure_future(asyncio.to_thread(self._loader.prefetch, vm))
        spares = self._loader.spares
        kind = vm.manifest.isolation_kind(self._isolation)
        worker = "none"
        # (an [environment]'s spares are its own, readied as before: SchedulerFactory)
        if spares is not None and kind is PROCESS and not vm.manifest.environment.enabled:
            ahead = not await self._loaded(vm)  # its first call will take a spare
            ready_for = functools.partial(spares.ready_for, ahead=ahead)
            try:
                ok = await asyncio.to_thread(ready_for, vm.imports, self._ready_timeout_s)
            except (OSError, ValueError):  # the deploy stands; its first call starts one
                log.exception("readying a worker for %s %s failed", vm.name, vm.version)
                ok = False
            worker = "ready" if ok else "not ready"
        left = max(self._ready_timeout_s - (time.monotonic() - start), 0.0)
        await asyncio.wait((fetched,), timeout=left)
        fetched.add_done_callback(_logged(vm))
        files = "ready" if fetched.done() and fetched.exception() is None else "not ready"
        return {"files": files, "worker": worker, "seconds": round(time.monotonic() - start, 3)}

    async def _loaded(self, vm: VersionManifest) -> bool:
        """Whether ``vm`` has an instance loaded here (its deploy loaded it: a warm-up, a
        probe, a later version of a function)."""
        try:
            entry = await self._registry.entry(vm.name)
        except FunctionNotFound:
            return False
        scheduler = entry.schedulers.get(vm.version)
        return scheduler is not None and scheduler.pool.instances > 0

    async def _routed(self, vm: VersionManifest, created: bool, policy: str | None) -> Deployed:
        """Prepare ``vm`` (stored) and move traffic to it, as its rollout says."""
        registry, repository = self._registry, self._registry.repository
        try:
            entry: ServedFunction | None = await registry.entry(vm.name)
        except FunctionNotFound:
            entry = None
        config = vm.manifest.rollout
        if entry is not None and entry.routing.traffic == {vm.version: 100}:
            return Deployed(vm.name, vm.version, created, entry.routing, rollout="unchanged")
        checks: dict[str, Any] = {}
        if entry is not None or config.warmup_file or config.probe_file:
            # a version held here already (kept warm for a rollback, say) stays as it
            # was if its checks fail now: only a candidate made for this deploy closes
            was = entry.schedulers.get(vm.version) if entry is not None else None
            candidate = (
                registry.held(entry, vm) if entry is not None else registry.new_scheduler(vm)
            )
            try:
                checks = await prepare(candidate, self._loader)
            except Exception:
                made = candidate is not was
                if made and (entry is None or vm.version not in entry.routing.traffic):
                    if entry is not None and entry.schedulers.get(vm.version) is candidate:
                        registry.hold(entry, vm.version, None)  # and closes it
                    else:
                        registry.background(sched.close(candidate))
                raise
            if entry is None:  # first version: routed below, with its instance
                routing = await asyncio.to_thread(cut_over, repository, vm)
                entry = await registry.entry(vm.name)
                registry.hold(entry, vm.version, candidate)  # the one made there: closed
                return Deployed(vm.name, vm.version, created, routing, checks=checks)
        chosen = RolloutPolicy(policy or config.policy)
        if entry is None:
            routing = await asyncio.to_thread(cut_over, repository, vm)
            await registry.entry(vm.name)
            return Deployed(vm.name, vm.version, created, routing, checks=checks)
        rollout = self.rollouts.of(vm.name)
        baseline = entry.primary
        running = rollout.canary
        if running is not None:
            if running.task is not None and not running.task.done():
                # the version the canary began from, not the one it had not finished
                # proving (at 50% the primary is the newer): the new rollout's baseline
                start = running.baseline
                if entry.schedulers.get(start.version.version) is start:
                    baseline = start
            await running.cancel(f"version {vm.version} was deployed")
        if chosen is RolloutPolicy.CANARY and baseline.version.version != vm.version:
            canary = Canary(
                baseline,
                entry.schedulers[vm.version],
                config,
                self._clock,
                lambda traffic, _: self._canary_step(entry, canary, traffic),
            )
            canary.written = dict(entry.routing.traffic)  # what its first step replaces
            rollout.canary = canary
            canary.start()
            rollout.last = canary.status
            await canary.first_step.wait()  # answered with the first share already routed
            return Deployed(
                vm.name, vm.version, created, entry.routing, rollout="canary", checks=checks
            )
        routing = await registry.write(entry, lambda r: r.cut_over(vm.version, now_iso()))
        rollout.last = RolloutStatus(RolloutPolicy.IMMEDIATE, vm.version, RolloutState.DONE)
        return Deployed(vm.name, vm.version, created, routing, checks=checks)

    async def _canary_step(
        self,
        entry: ServedFunction,
        canary: Canary,
        traffic: dict[str, int],
        *,
        by_hand: bool = False,
    ) -> bool:
        """Write ``traffic`` for ``canary``: only over the split it wrote last (False,
        and nothing written, when the routing was changed elsewhere meanwhile: the
        canary stops), unless ``by_hand`` (a rollback by hand, after the canary was
        cancelled: the last word)."""
        registry = self._registry
        if not by_hand and (
            self.rollouts.of(entry.name).canary is not canary or not registry.is_current(entry)
        ):
            return False
        new, expected = canary.candidate.version.version, dict(canary.written)

        def step(r: Routing) -> Routing:
            if not by_hand and dict(r.traffic) != expected:
                raise RoutingChanged(dict(r.traffic))
            if traffic.get(new, 0) == 0:  # rolled back: the failed version leaves no history
                previous = tuple(v for v in r.with_traffic(traffic, "").previous if v != new)
                return Routing(traffic=traffic, previous=previous, updated_at=now_iso())
            return r.with_traffic(traffic, now_iso())

        writing = canary.writing = asyncio.ensure_future(registry.write(entry, step))
        try:  # shielded: a cancel meanwhile waits for it (Canary.cancel)
            await asyncio.shield(writing)
        except RoutingChanged as changed:
            log.warning(
                "canary %s of %s stopped: the routing was changed elsewhere to %s",
                new,
                entry.name,
                changed.traffic,
            )
            return False
        canary.written = dict(traffic)
        return True

    async def set_traffic(self, name: str, traffic: Mapping[str, int]) -> Routing:
        """A split set by hand (``fnrt traffic``); stops a canary under way."""
        registry = self._registry
        entry = await registry.entry(name)
        for version in traffic:
            await asyncio.to_thread(registry.repository.get_version, name, version)
        canary = self.rollouts.of(name).canary
        if canary is not None:
            await canary.cancel("the traffic was set by hand")
        shares = {str(v): int(p) for v, p in traffic.items()}
        Routing(shares)  # validates: shares are percentages summing to 100
        return await registry.write(entry, lambda r: r.with_traffic(shares, now_iso()))

    async def rollback(self, name: str) -> Routing:
        """All traffic back to the version served before the last cut-over.

        Instant while that version is still loaded (within its rollback
        window); otherwise it loads from the disk cache on its next request.
        """
        registry = self._registry
        entry = await registry.entry(name)
        rollout = self.rollouts.of(name)
        canary = rollout.canary
        if canary is not None and canary.task is not None and not canary.task.done():
            await canary.cancel("rolled back by hand")  # back to the version it started from
            base = canary.baseline.version.version
            await self._canary_step(entry, canary, {base: 100}, by_hand=True)
            rollout.canary = None
            canary.status.state = RolloutState.ROLLED_BACK
            canary.status.reason = "rolled back by hand"
            canary.status.percent = 0
            return entry.routing
        if not entry.routing.previous:
            raise Conflict(f"'{name}' has no earlier version to roll back to")
        left = entry.routing.primary
        routing = await registry.write(entry, lambda r: r.rolled_back(now_iso()))
        last = rollout.last
        rollout.last = RolloutStatus(
            last.policy if last is not None and last.to == left else RolloutPolicy.IMMEDIATE,
            left,
            RolloutState.ROLLED_BACK,
            percent=0,
            reason=f"rolled back by hand to {routing.primary}",
            finished_unix_s=round(time.time(), 3),
        )
        return routing

    async def delete(self, name: str) -> None:
        """Stop ``name``'s canary, if one is under way, and delete the function."""
        await self.rollouts.forget(name, "the function was deleted")
        await self._registry.delete(name)

    async def close(self) -> None:
        """Stop every canary under way (the server is stopping)."""
        await self.rollouts.close()


def _logged(vm: VersionManifest) -> Callable[[asyncio.Future[None]], None]:
    """A callback that logs why the deploy-time fetch of ``vm``'s files failed (its first
    call fetches them again, and says why if it must)."""

    def done(fetched: asyncio.Future[None]) -> None:
        exc = None if fetched.cancelled() else fetched.exception()
        if exc is not None:
            log.warning("readying %s %s: its files: %s", vm.name, vm.version, exc)

    return done
