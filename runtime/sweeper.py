"""The node's periodic work: scale idle instances to zero, pre-warm, retire, watch.

Every ``sweep_interval_s`` the sweeper scales idle instances to zero as their
keep-alive policies say (a learned policy's plan may also pre-warm a function
ahead of its predicted call; each unload is logged and counted with its
reason: "plan", unloaded early to be loaded again ahead, or "idle", its
keep-alive over; the memory budget's evictions are "budget", in the order of
what the keeper says each instance is worth, :meth:`Sweeper.appraise`), closes
versions whose rollback window passed, and sweeps split tails; every
``watch_interval_s`` it asks the registry to pick up routing other nodes wrote.
Histories of the keep-alive keeper are saved every minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import Any

from fnrt.loader.instance import InstanceLoader
from fnrt.loader.launch import worker_bytes
from fnrt.loader.memory import MemoryBudget
from fnrt.runtime import scheduler as sched
from fnrt.runtime.clock import Clock
from fnrt.runtime.pool import InstanceState
from fnrt.runtime.prewarm.keeper import Keeper
from fnrt.runtime.prewarm.policies import Policy
from fnrt.runtime.registry import Registry
from fnrt.runtime.scheduler import Scheduler
from fnrt.runtime.served import ServedFunction
from fnrt.runtime.split import Splits

log = logging.getLogger("fnrt.sweeper")

#: How often the keep-alive histories are written to the cache folder.
HISTORY_SAVE_INTERVAL_S = 60.0
PREWARM_TURN_S = 5.0  # the longest a pre-warm waits for the one started before to choose


def prewarm_lead_s(last_load_s: float) -> float:
    """How long before a plan's first minute a pre-warm starts: twice the function's
    last load and 5 s more (the sweep's second, a slower fetch), a minute at most."""
    return min(60.0, 5.0 + 2.0 * last_load_s)


def _settle(chosen: asyncio.Future[None]) -> None:
    """``chosen`` done, if it is not yet (a pre-warm's turn over)."""
    if not chosen.done():
        chosen.set_result(None)


def rollback_over(left_at: Mapping[str, float], window_s: float, now: float) -> list[str]:
    """The versions whose rollback window has passed: ``window_s`` since they lost their
    traffic (``left_at``: version -> when)."""
    return [version for version, left in left_at.items() if now - left >= window_s]


class Sweeper:
    """Scale to zero, pre-warm, retire versions and watch the store, on timers."""

    def __init__(
        self,
        registry: Registry,
        splits: Splits,
        loader: InstanceLoader,
        memory: MemoryBudget,
        clock: Clock,
        keeper: Keeper | None = None,
        *,
        sweep_interval_s: float = 1.0,
        watch_interval_s: float = 1.0,
        gpu_memory: MemoryBudget | None = None,
        evicted: Callable[[str, str], None] | None = None,
        holding: Callable[[], Iterable[Scheduler]] | None = None,
    ) -> None:
        """``holding``: the schedulers holding or loading an instance (the node's
        ``Holders``), so that a sweep looks only at the functions that may need it;
        None: at every function."""
        self._evicted = evicted
        self._holding = holding
        for budget in (memory, gpu_memory):  # the GPU's decides and counts as the host's
            if budget is None:
                continue
            budget.evicted = self.evicted
            if keeper is not None:
                budget.appraise = self.appraise
        self._registry = registry
        self._gpu_memory = gpu_memory
        self._splits = splits
        self._loader = loader
        self._memory = memory
        self._clock = clock
        self.keeper = keeper
        self._sweep_interval_s = sweep_interval_s
        self._watch_interval_s = watch_interval_s
        self._loops: list[asyncio.Task[None]] = []
        self._saved_at = 0.0
        self._prewarming: dict[str, int] = {}  # pre-warms loading: their bytes, by key
        #: the last pre-warm started: done once it has chosen (its files fetched, its
        #: room asked) and the one before it has; each waits for the one before, so
        #: they choose in start order
        self._chosen: asyncio.Future[None] | None = None
        self._started: set[str] = set()  # the keys of the pre-warms under way

    def start(self) -> None:
        self._loops = [
            asyncio.ensure_future(self._every(self._sweep_interval_s, self.sweep)),
            asyncio.ensure_future(self._every(self._watch_interval_s, self._registry.watch)),
        ]

    async def close(self) -> None:
        for loop in self._loops:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop
        if self.keeper is not None:
            await asyncio.to_thread(self.keeper.write, self.keeper.snapshot())

    async def sweep(self) -> list[str]:
        """Scale idle instances to zero as their keep-alive policies say, pre-warm those
        whose next call is predicted, and close versions whose rollback window passed
        (they finish what they accepted); names unloaded."""
        registry = self._registry
        now = self._clock.now()
        unloaded = []
        awake = self._awake()
        for entry in registry.entries():
            if (awake is not None and entry.name not in awake) or self._at_rest(entry):
                continue
            window = entry.primary.version.manifest.rollout.rollback_window_s
            for version in rollback_over(entry.left_at, window, now):
                if registry.retire(entry, version):  # the table is the registry's
                    unloaded.append(entry.name)
            for version, scheduler in list(entry.schedulers.items()):
                if version in entry.left_at:
                    continue  # kept warm for a rollback
                learned = self.keeper is not None and scheduler is entry.primary
                policy = Policy(scheduler.version.manifest.scaling.keep_alive_policy)
                learned = learned and policy is not Policy.FIXED
                if await sched.scale_to_zero(scheduler, now, keep_primary=learned):
                    unloaded.append(scheduler.name)  # its keep-alive (the manifest's) over
                    log.info("unloading %s (reason: idle)", scheduler.name)
                    self.evicted(scheduler.key, "idle")
                if learned and await self._keep(scheduler, policy, now):
                    unloaded.append(scheduler.name)
        if self._splits.active:
            held = {(e.name, v) for e in registry.entries() for v in e.schedulers}
            unloaded += await self._splits.sweep(now, held)
        if self.keeper is not None and now - self._saved_at >= HISTORY_SAVE_INTERVAL_S:
            self._saved_at = now
            await asyncio.to_thread(self.keeper.write, self.keeper.snapshot())
        return unloaded

    def _awake(self) -> set[str] | None:
        """The functions that may not be at rest (:meth:`_at_rest`), from sets kept as
        they change: a version holding or loading an instance, one kept for a rollback,
        a plan pending. None: not known here (every function is looked at). At 10,000
        functions served, a look at each took the event loop 24 ms a second."""
        if self._holding is None:
            return None
        awake = {s.name for s in self._holding()} | self._registry.rollbacks.names()
        if self.keeper is not None:
            awake |= self.keeper.pending_names()
        return awake

    def _at_rest(self, entry: ServedFunction) -> bool:
        """Nothing to scale down, retire or pre-warm: every version cold, none kept for a
        rollback, no plan pending. The sweep passes it by (a few dict lookups), so a
        node's idle functions cost it next to nothing per second."""
        if entry.left_at or (self.keeper is not None and self.keeper.pending(entry.name)):
            return False
        return all(s.pool.state is InstanceState.COLD for s in entry.schedulers.values())

    def evicted(self, key: str, reason: str) -> None:
        """One instance unloaded for ``reason`` (budget, plan or idle): counted."""
        if self._evicted is not None:
            self._evicted(key, reason)

    def appraise(self, resident: Any) -> tuple[float, bool]:
        """What keeping ``resident`` (a version's scheduler) is worth to the memory budget,
        and whether it must stay: its ``auto`` plan's worth, the keeper's, as ``fnrt
        simulate --node-memory-gb`` weighs it; other policies' are all alike (the least
        recently used goes first)."""
        keeper = self.keeper
        if keeper is None:
            return 0.0, False
        scaling = resident.version.manifest.scaling
        policy = Policy(scaling.keep_alive_policy)
        if policy is not Policy.AUTO:
            return 0.0, False
        instance_bytes = resident.stats.last_load_bytes or sum(self._unmeasured(resident))
        return keeper.weigh(
            resident.name,
            policy,
            memory_gb=instance_bytes / 2**30,
            config=keeper.priced(scaling.cold_start_price_gb_s, scaling.cold_start_price_s),
            budget_bytes=self._memory.budget_bytes,
        )

    async def _keep(self, scheduler: Scheduler, policy: Policy, now: float) -> bool:
        """Act on the keeper's plan for a function's first instance; True if unloaded."""
        assert self.keeper is not None
        activity = sched.activity(scheduler)
        if activity.busy or activity.queued:
            return False
        scaling = scheduler.version.manifest.scaling
        if activity.loaded and scheduler.pool.instances <= scaling.min_instances:
            return False
        idle_for = max(now - activity.last_active_s, 0.0)
        instance_bytes = scheduler.stats.last_load_bytes or sum(self._unmeasured(scheduler))
        action = self.keeper.act(
            scheduler.name,
            policy,
            keep_alive_s=scaling.keep_alive_s,
            idle_since_unix=self.keeper.wall() - idle_for,
            loaded=activity.loaded,
            memory_gb=instance_bytes / 2**30,
            config=self.keeper.priced(scaling.cold_start_price_gb_s, scaling.cold_start_price_s),
            lead_s=prewarm_lead_s(scheduler.stats.last_load_timings_s.get("total_s", 0.0)),
            budget_bytes=self._memory.budget_bytes,
        )
        if action.unload and self.keeper.filling(scheduler.name) and self._memory.fits(0):
            return False  # kept while the budget has room: evicted by worth when it has not
        if action.unload:
            if await sched.scale_to_zero(scheduler, now, force=True):
                log.info("unloading %s (reason: %s)", scheduler.name, action.why)
                self.evicted(scheduler.key, action.why)
                return True
            return False
        if action.prewarm:
            self._registry.background(self.prewarm(scheduler))
        return False

    async def prewarm(self, scheduler: Scheduler) -> None:
        """Fetch its files into the disk cache ahead of a predicted call, then load it,
        only into memory nobody else is using (or, when its plan fills the budget, that
        of instances worth less): when it does not fit, the files alone. The files come
        first: a store that is down fails the pre-warm before anything is evicted, and
        the load's own room is made right after the choice, not a download later."""
        if scheduler.key in self._started:
            return  # one under way already (a sweep a second later, while it waits)
        needed, needed_device = scheduler.stats.expected_bytes(*self._unmeasured(scheduler))
        gpu = self._gpu_memory
        before, chosen = self._chosen, asyncio.get_running_loop().create_future()
        self._chosen = chosen
        self._started.add(scheduler.key)
        try:
            await asyncio.to_thread(self._loader.prefetch, scheduler.version)
            # pre-warms started side by side choose in the order the sweep started them
            # (the order of the function table), not the order their files came in, as
            # ``fnrt simulate`` takes a minute's pre-warms; a fetch that hangs holds the
            # next no longer than PREWARM_TURN_S
            if before is not None and not before.done():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(PREWARM_TURN_S):
                        await asyncio.shield(before)
            # each counts those chosen before it and not yet holding the room of their
            # load (which the budget counts once they do)
            loading = self._loading()
            keeper = self.keeper
            filled = keeper is not None and keeper.filling(scheduler.name)
            if keeper is not None and filled and not self._memory.fits(needed + loading):
                # room from the instances worth less than this one when its call is due
                scaling = scheduler.version.manifest.scaling
                due, _ = keeper.weigh(
                    scheduler.name,
                    Policy.AUTO,
                    memory_gb=needed / 2**30,
                    config=keeper.priced(scaling.cold_start_price_gb_s, scaling.cold_start_price_s),
                    ahead=True,
                    budget_bytes=self._memory.budget_bytes,
                )
                release = await self._memory.make_room(scheduler.key, needed + loading, below=due)
                release()  # (its load makes and holds its own room)
                loading = self._loading()
            if self._memory.fits(needed + loading) and (gpu is None or gpu.fits(needed_device)):
                self._prewarming[scheduler.key] = needed
                _settle(chosen)
                try:
                    if await sched.prewarm(scheduler):
                        log.info("pre-warmed %s ahead of its predicted call", scheduler.name)
                finally:
                    self._prewarming.pop(scheduler.key, None)
        except Exception as exc:
            log.warning("pre-warming %s failed: %s", scheduler.name, exc)
        finally:
            self._started.discard(scheduler.key)
            if before is not None and not before.done():  # failed before its turn: the
                # next still waits for the one before this (a chain, never cut)
                before.add_done_callback(lambda _: _settle(chosen))
            else:
                _settle(chosen)

    def _unmeasured(self, scheduler: Scheduler) -> tuple[int, int]:
        """What its version's instance holds before one has been measured: its files,
        and, when it runs in a worker process, the worker's own (``launch.worker_bytes``)."""
        return scheduler.version.size_bytes, worker_bytes(self._loader, scheduler.isolation)

    def _loading(self) -> int:
        return unheld_bytes(self._prewarming, self._memory.holding_room())

    async def _every(self, interval_s: float, work: Callable[[], Awaitable[object]]) -> None:
        while True:
            await self._clock.sleep(interval_s)
            try:
                await work()
            except Exception:
                log.exception("%s failed", getattr(work, "__name__", "periodic work"))


def unheld_bytes(prewarming: Mapping[str, int], holding_room: Collection[str]) -> int:
    """The bytes of the pre-warms under way (``prewarming``: by key) whose loads hold no
    room in the budget yet: a load holds its room from its ``make_room`` on (the budget
    counts it then, and it must not be counted twice)."""
    return sum(size for key, size in prewarming.items() if key not in holding_room)
