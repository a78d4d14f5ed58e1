"""One function version on this node: its instance pool, its batcher, its guards' state.

A :class:`Scheduler` holds the parts that serve one version and wires them
together; it decides nothing itself. The :class:`~fnrt.runtime.pool.InstancePool`
loads, runs, replaces and scales instances; the
:class:`~fnrt.runtime.batcher.Batcher` admits requests into the queue and
turns it into batches; :class:`~fnrt.runtime.guards.Protection` is what the
guards around ``Gateway.submit`` keep per version (breaker, result cache,
kept failures). Events go to an observer (``events.py``), never to metrics
directly. :class:`SchedulerFactory` builds them with the node's services.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fnrt.functions.errors import Unavailable
from fnrt.functions.handler import Request
from fnrt.functions.manifest import DEFAULT_ISOLATION, IsolationMode
from fnrt.functions.version import VersionManifest
from fnrt.loader.instance import InstanceLoader
from fnrt.loader.launch import Launch
from fnrt.loader.memory import Holders, MakeRoom
from fnrt.runtime.batcher import Batcher
from fnrt.runtime.clock import Clock
from fnrt.runtime.events import Events, NoEvents
from fnrt.runtime.intake import Admission
from fnrt.runtime.pool import InstancePool, LoadInstance, WatchFiles
from fnrt.runtime.protection import Protection, Served
from fnrt.runtime.queue import Outputs, Priority
from fnrt.runtime.scaling import Activity
from fnrt.runtime.sequencer import Sequencer
from fnrt.runtime.stats import Stats

__all__ = ["Scheduler", "SchedulerFactory", "Served"]

THREAD = IsolationMode.THREAD
PROCESS = IsolationMode.PROCESS


class Scheduler:
    """One function version's parts, wired once: a plain record. Its pool (slots,
    instances), its queue (``batcher``: a :class:`Batcher`, or the :class:`Sequencer`
    of a generative version, also ``sequencer``), its guards' state (``protection``) and
    stats. What the parts do together are this module's functions (:func:`describe`,
    :func:`unload`, ...); the record itself answers only the memory budgets, which
    evict versions by it (``fnrt.loader.memory.Resident``)."""

    def __init__(
        self,
        version: VersionManifest,
        load: LoadInstance,
        clock: Clock,
        *,
        events: Events | None = None,
        admission: Admission | None = None,
        make_room: MakeRoom | None = None,
        isolation: IsolationMode = DEFAULT_ISOLATION,
        redis: Any = None,
        device_room: Callable[[], bool] | None = None,
        watch_files: WatchFiles | None = None,
    ) -> None:
        self.version = version
        self.name = version.name  # fixed: read on every request
        self.clock = clock
        self.isolation = isolation  # where this version's instances run
        self.stats = Stats()
        events = events or NoEvents()
        self.pool = InstancePool(
            version,
            load,
            clock,
            self.stats,
            events,
            make_room,
            in_thread=isolation is THREAD,
            device_room=device_room,
            watch_files=watch_files,
        )
        self.protection = Protection(version.manifest, clock, redis=redis, version=version.version)
        self.pool.loads.died = self._instance_lost
        # A generative version's requests are sequences, stepped by a continuous batcher.
        self.batcher: Batcher | Sequencer
        self.sequencer: Sequencer | None = None
        if version.manifest.generative:
            self.batcher = self.sequencer = Sequencer(
                version, self.pool, clock, self.stats, events, admission, self.protection
            )
        else:
            self.batcher = Batcher(
                version, self.pool, clock, self.stats, events, admission, self.protection
            )

    def _instance_lost(self, cause: str, retry_at: float, reason: str) -> None:
        """An instance died: when that opens the breaker (a crash loop), every request
        queued for the version is refused now, not left waiting out the backoff."""
        now = self.clock.now()
        if self.protection.instance_lost(now, cause, retry_at, reason):
            refusal = self.protection.refusal(self.name, self.version.version, now)
            self.batcher.fail_queued(refusal)

    # --- as a memory resident (fnrt.loader.memory: what the budgets evict by) -------------

    @property
    def key(self) -> str:
        return f"{self.name}/{self.version.version}"

    @property
    def resident_bytes(self) -> int:
        return self.pool.instance_bytes

    @property
    def device_bytes(self) -> int:
        return self.pool.device_bytes

    @property
    def last_active_s(self) -> float:
        return activity(self).last_active_s

    @property
    def busy(self) -> bool:
        """Whether a memory budget must leave it loaded: running or with calls waiting,
        or held loaded by its manifest (``min_instances``)."""
        found = activity(self)
        return found.busy or found.queued > 0 or self.version.manifest.scaling.min_instances > 0

    async def evict(self) -> bool:
        return await scale_to_zero(self, self.clock.now(), force=True)


# --- what the version's parts do together (functions of the record, not its methods) ---


def outstanding(s: Scheduler) -> int:
    """Requests not answered yet: queued, and a generative version's running sequences
    (between its steps no batch runs, yet the version is busy)."""
    return s.batcher.queued + (s.sequencer.active if s.sequencer is not None else 0)


def activity(s: Scheduler) -> Activity:
    """The version as a whole: any instance loaded, any busy, what is outstanding."""
    return s.pool.activity(outstanding(s))


def submit(
    s: Scheduler,
    inputs: Request,
    *,
    priority: Priority | None = None,
    alone: bool = False,
    timeout_s: float | None = None,
) -> Awaitable[Served]:
    """Queue ``inputs`` with no guards (a job's record, a canary's probe, a sweep's load):
    what waits for the answer. Data routes go through ``Gateway.submit``. ``alone``: run
    it in a batch of its own (a job record tried again after its batch failed, so it
    fails only for its own sake). ``timeout_s``: its deadline (None: the version's
    default; ``math.inf``: none, as a job's records have)."""
    call = s.batcher.call(inputs, s.clock.now(), priority, timeout_s, scheduler=s, alone=alone)
    return s.batcher.submit(call)


def submit_block(s: Scheduler, records: Sequence[Request]) -> Awaitable[list[Outputs]]:
    """Queue a block of job records (at most a batch; see :meth:`Batcher.submit_block`) at
    job priority; what waits for their outputs. A generative version takes its records
    one by one (:func:`submit`)."""
    if s.sequencer is not None:
        raise TypeError(f"function '{s.name}' is generative: submit its records one by one")
    assert isinstance(s.batcher, Batcher)
    return s.batcher.submit_block(list(records))


async def warm(s: Scheduler) -> None:
    """Load the first instance now if there is none (shares a load under way)."""
    await s.pool.ensure(s.pool.slots[0])


async def prewarm(s: Scheduler) -> bool:
    """Load ahead of a predicted call; False when it was loaded already (or closing)."""
    pool = s.pool
    if s.batcher.closing or pool.instances:
        return False
    pool.starts.prewarming(s.clock.now())  # before the load: see Starts.prewarming
    try:
        await pool.ensure(pool.slots[0])
    except BaseException:
        pool.starts.prewarm_failed()
        raise
    return True


async def scale_to_zero(
    s: Scheduler, now: float, *, force: bool = False, keep_primary: bool = False
) -> bool:
    """Drop idle instances (see :meth:`InstancePool.scale_to_zero`)."""
    return await s.pool.scale_to_zero(now, outstanding(s), force=force, keep_primary=keep_primary)


async def unload(s: Scheduler, wait_s: float) -> tuple[bool, int]:
    """Scale to zero now, waiting up to ``wait_s`` for running batches to finish and
    stopping those that do not (503 for their requests). Whether any instance was
    unloaded, and the batches stopped."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s  # real time: this waits on running handlers
    dropped = await scale_to_zero(s, s.clock.now(), force=True)
    while s.pool.instances and activity(s).busy and loop.time() < deadline:
        await asyncio.sleep(0.05)
        dropped |= await scale_to_zero(s, s.clock.now(), force=True)
    stopped = s.pool.stop_running("unloaded while its batch ran")
    settle = loop.time() + 1.0
    while activity(s).busy and loop.time() < settle:  # the stopped batches unwind
        await asyncio.sleep(0.01)
    dropped |= await scale_to_zero(s, s.clock.now(), force=True)
    return dropped or stopped > 0, stopped


def stop(s: Scheduler, reason: str) -> None:
    """Cut off everything now: queued requests and running batches answer 503
    (``reason``), running instances are abandoned. For a shutdown past its time."""
    s.batcher.closing = True
    s.batcher.fail_queued(Unavailable(f"function '{s.name}': {reason}; retry"))
    s.pool.stop_running(reason)
    s.batcher.wake()


async def close(s: Scheduler) -> None:
    """Stop taking requests, finish the queued ones, then unload."""
    await s.batcher.close()
    await s.pool.close()


def describe(s: Scheduler) -> dict[str, Any]:
    """The version as ``GET /v1/functions/{name}`` shows it."""
    batcher, pool = s.batcher, s.pool
    per_item, fixed = batcher.cost.coefficients()
    now = s.clock.now()
    last_active = activity(s).last_active_s
    return {
        "version": s.version.version,
        "isolation": s.isolation.value,
        "state": pool.state.value,
        "instances": pool.instances,
        "queued": batcher.queued,
        "running": pool.running,
        "queued_by_priority": batcher.depth_by_priority(),
        "idle_s": round(max(now - last_active, 0.0), 3),
        "instance_bytes": pool.instance_bytes,
        "device_bytes": pool.device_bytes,
        "devices": [str(i.device) for i in pool.loaded_instances()],
        "cost_model": {
            "per_item_ms": round(per_item * 1000, 4),
            "fixed_ms": round(fixed * 1000, 4),
        },
        "arrival_rate_per_s": round(batcher.arrivals.rate_per_s(now), 3),
        **s.stats.describe(),
        **s.protection.describe(now),
        **({"generation": s.sequencer.describe()} if s.sequencer is not None else {}),
    }


@dataclass(frozen=True)
class SchedulerFactory:
    """Builds schedulers with the node's services (its one place of construction)."""

    loader: InstanceLoader
    clock: Clock
    events: Events
    admission: Admission
    make_room: MakeRoom | None = None
    isolation: IsolationMode = DEFAULT_ISOLATION  # where instances run unless a manifest says
    redis: Any = None  # the shared result cache's client (``--redis-url``), if any
    #: on a GPU with ``--gpu-concurrency``: whether one more instance may share it
    device_room: Callable[[], bool] | None = None
    #: the node's residents holding an instance, which each scheduler's pool keeps
    #: (what its memory budgets weigh)
    holders: Holders | None = None

    def __call__(self, vm: VersionManifest, load: LoadInstance | None = None) -> Scheduler:
        """A scheduler of ``vm``; ``load`` builds its instances in a thread (default:
        the handler, in a thread or a worker process as its ``[isolation]`` or the
        node says)."""
        kind = THREAD if load else vm.manifest.isolation_kind(self.isolation)
        spares = self.loader.spares
        if spares is not None and kind is PROCESS:  # its first cold start takes a spare
            if not vm.manifest.environment.enabled:
                spares.expect(vm.imports)
            else:  # of its environment, where this node has built it (at its deploy, say)
                built = self.loader.environments.built(vm.manifest.environment.requirements)
                if built is not None:
                    spares.expect_environment(built, vm.imports)
        scheduler = Scheduler(
            vm,
            load or Launch(self.loader, kind),
            self.clock,
            events=self.events,
            admission=self.admission,
            make_room=self.make_room,
            isolation=kind,
            redis=self.redis,
            device_room=self.device_room,
            watch_files=self.loader.watch_files,
        )
        if self.holders is not None:
            scheduler.pool.holding = functools.partial(self.holders.holding, scheduler)
        return scheduler
