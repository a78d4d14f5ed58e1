"""The composition root: one place builds a node and hands each part the services it uses.

A :class:`Node` is everything one fnrt server runs: the store (through a
:class:`~fnrt.loader.repository.Repository`), the loader and its caches, the
function table (:class:`~fnrt.runtime.registry.Registry`), split tails, the
one way in for data (:class:`~fnrt.runtime.gateway.Gateway`), the deployer,
the sweeper and the telemetry. The HTTP layer gets a Node and calls its
services; nothing reaches through one service to another's parts.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from fnrt.functions.handler import Device
from fnrt.functions.manifest import IsolationMode
from fnrt.loader.cache import BlobCache, CacheConfig
from fnrt.loader.device import choose_devices, device_memory_bytes
from fnrt.loader.instance import InstanceLoader
from fnrt.loader.leftovers import remove_leftovers
from fnrt.loader.memory import Holders, MemoryBudget, room_maker
from fnrt.loader.placement import GpuBudgets, Placement
from fnrt.loader.repository import Repository
from fnrt.loader.scrub import Scrubber, ScrubConfig
from fnrt.loader.spares import SpareWorkers
from fnrt.loader.stores import FileStore, open_store
from fnrt.runtime import scheduler as sched
from fnrt.runtime.access import InvokeKeys
from fnrt.runtime.clock import Clock, SystemClock
from fnrt.runtime.deployer import Deployer
from fnrt.runtime.events import TelemetryEvents
from fnrt.runtime.gateway import Gateway
from fnrt.runtime.intake import Admission
from fnrt.runtime.jobs.board import JobBoard, node_id
from fnrt.runtime.jobs.runner import JobConfig, JobRunner
from fnrt.runtime.lifecycle import Lifecycle
from fnrt.runtime.prewarm.keeper import Keeper
from fnrt.runtime.prewarm.policies import PolicyConfig
from fnrt.runtime.registry import Registry
from fnrt.runtime.result_cache import redis_client
from fnrt.runtime.scheduler import Scheduler, SchedulerFactory
from fnrt.runtime.settings import ServerSettings
from fnrt.runtime.split import Splits
from fnrt.runtime.sweeper import Sweeper
from fnrt.tracing.metrics import FunctionState
from fnrt.tracing.telemetry import Telemetry

log = logging.getLogger("fnrt.node")

#: How long closing waits for accepted work before cutting it off (503).
CLOSE_TIMEOUT_S = 30.0


@dataclass(frozen=True, eq=False)
class Node:
    """One server's services."""

    settings: ServerSettings
    clock: Clock
    repository: Repository
    loader: InstanceLoader
    telemetry: Telemetry
    admission: Admission
    memory: MemoryBudget
    gpu_memory: MemoryBudget | None  # on a GPU: its memory's budget
    registry: Registry
    splits: Splits
    gateway: Gateway
    deployer: Deployer
    sweeper: Sweeper
    jobs: JobRunner
    invoke_keys: InvokeKeys | None = None  # None: invokes need no key
    lifecycle: Lifecycle = field(default_factory=Lifecycle)

    async def start(self) -> None:
        """Remove what killed processes left behind, start the spare workers when their
        imports are known (named, or learned on this cache before), read the store's
        functions (loading those that start warm; what their code imports brings the
        spares up to date), start the timers."""
        store = self.repository.store
        store_root = store.root if isinstance(store, FileStore) else None
        freed = await asyncio.to_thread(
            remove_leftovers, Path(self.settings.cache_dir) / "uploads", store_root
        )
        if freed:
            log.warning("removed %d bytes of temporary files left by killed processes", freed)
        spares = self.loader.spares
        if spares is not None and spares.known:  # named or learned: ready for the first
            spares.refill(now=True)
        warming = await self.registry.start(preload=self.settings.preload)
        if spares is not None and spares.known:  # and what the store's functions import
            spares.refill(now=True)
        self.lifecycle.warming = set(warming)
        if self.loader.scrubber is not None:  # the files loaded instances map
            self.loader.scrubber.start()
        self.sweeper.start()
        self.jobs.start()
        self.lifecycle.started()

    async def drain(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for queued and running work to finish, then cut off
        what is left (503: retry elsewhere) and abandon instances that still run. True
        when everything finished in time. Job chunks running here are not waited for:
        they go back to the fleet's queue at once."""
        await self.jobs.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while any(_busy(s) for s in self.schedulers()):
            if loop.time() >= deadline:
                busy = [s.key for s in self.schedulers() if _busy(s)]
                log.warning("shutdown: cutting off %s after %.1f s", ", ".join(busy), timeout_s)
                for scheduler in self.schedulers():
                    sched.stop(scheduler, "the server is shutting down")
                return False
            await asyncio.sleep(0.05)
        return True

    async def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Stop the timers, finish what was accepted (cut off past ``timeout_s``), unload
        everything. Job chunks still running go back to the fleet's queue."""
        await self.jobs.close()
        await self.sweeper.close()
        await self.drain(timeout_s)
        await self.deployer.close()  # canaries under way stop
        await self.registry.close()
        await self.splits.close()
        if self.loader.scrubber is not None:
            await asyncio.to_thread(self.loader.scrubber.close)
        spares = self.loader.spares
        if spares is not None:  # last: a worker it started dies with its thread
            await asyncio.to_thread(spares.close)

    def schedulers(self) -> list[Scheduler]:
        """Every scheduler here: function versions (primaries first), then split tails."""
        return [*self.registry.loaded(), *self.splits.schedulers()]


def build_node(
    settings: ServerSettings,
    *,
    clock: Clock | None = None,
    telemetry: Telemetry | None = None,
    loader: InstanceLoader | None = None,
    keeper: Keeper | None = None,
    learn_keep_alive: bool = True,
) -> Node:
    """A node over the settings' store, cache folder and device.

    Tests pass their own ``clock`` (a manual one), ``telemetry`` (an in-memory
    span exporter), ``loader`` or ``keeper``; with ``learn_keep_alive`` False
    every function keeps its fixed ``keep_alive_s`` (no keeper, no pre-warming).
    """
    clock = clock or SystemClock()
    telemetry = telemetry or Telemetry()
    devices: list[Device] = []
    if loader is None:
        repository = Repository(open_store(settings.store, settings.s3_config()))
        cache_dir = Path(settings.cache_dir)
        blobs = BlobCache(CacheConfig(cache_dir, settings.disk_cache_bytes))
        devices = choose_devices(settings.device)  # DeviceRefused: a GPU that is not there
        loader = InstanceLoader(repository, cache_dir, devices[0], blobs)
        if settings.spare_workers:
            loader.spares = SpareWorkers(
                settings.spare_workers,
                settings.worker_imports,
                remembered=cache_dir / "spares" / "imports.json",
            )
    repository = loader.repository
    if loader.scrubber is None:
        scrub = ScrubConfig(settings.scrub_interval_s, settings.scrub_rate_bytes_s)
        loader.scrubber = Scrubber(scrub)
    if keeper is None and learn_keep_alive:
        keeper = Keeper(
            Path(loader.cache_dir) / "prewarm" / "history.json",
            PolicyConfig(
                cold_start_price_mean_s=settings.cold_start_price_mean_s,
                cold_start_price_gb_s=settings.cold_start_price_gb_s,
            ),
            fill_memory=settings.fills_memory,
        )
    admission = Admission(settings.max_queued)

    # The budgets weigh the schedulers holding an instance, which each keeps up to date.
    holders = Holders()
    memory = MemoryBudget(settings.memory_budget, holders)
    gpu_memory: MemoryBudget | None = None
    device_room = None
    if loader.device.kind == "cuda":  # each GPU its budget and cap; a load goes to the freest
        gpus = devices or [loader.device]
        budgets = {d.index: settings.gpu_memory_budget(device_memory_bytes(d.index)) for d in gpus}
        loader.placement = Placement(
            gpus, budgets, lambda: on_devices(holders()), settings.gpu_concurrency
        )
        gpu_memory = GpuBudgets(loader.placement, holders)
        if settings.gpu_concurrency:
            device_room = loader.placement.has_room
    factory = SchedulerFactory(
        loader,
        clock,
        TelemetryEvents(telemetry),
        admission,
        room_maker(memory, gpu_memory),
        isolation=IsolationMode(settings.isolation),
        redis=redis_client(settings.redis_url) if settings.redis_url else None,
        device_room=device_room,
        holders=holders,
    )
    spares = loader.spares
    learn = None  # what the store's functions import, read at the start: for the spares
    if spares is not None and factory.isolation is IsolationMode.PROCESS:  # their loads only
        learn = functools.partial(spares.expect, refill=False)
    registry = Registry(repository, factory, clock, keeper, imports_seen=learn)
    splits = Splits(registry, loader, factory)
    jobs = JobRunner(
        JobBoard(repository.store, node_id()),
        registry,
        JobConfig(
            enabled=settings.jobs,
            poll_interval_s=settings.job_poll_interval_s,
            lease_s=settings.job_lease_s,
            chunks_per_node=settings.job_chunks,
            retention_s=settings.job_retention_s,
        ),
        serving=lambda: not node.lifecycle.draining,
    )
    node: Node = Node(
        settings=settings,
        clock=clock,
        repository=repository,
        loader=loader,
        telemetry=telemetry,
        admission=admission,
        memory=memory,
        gpu_memory=gpu_memory,
        registry=registry,
        splits=splits,
        gateway=Gateway(registry, splits, clock, keeper),
        invoke_keys=invoke_keys(settings),
        deployer=Deployer(registry, splits, loader, clock, isolation=factory.isolation),
        sweeper=Sweeper(
            registry,
            splits,
            loader,
            memory,
            clock,
            keeper,
            gpu_memory=gpu_memory,
            evicted=lambda _key, why: telemetry.metrics.evictions.labels(reason=why).inc(),
            holding=lambda: cast(list[Scheduler], holders()),
            sweep_interval_s=settings.sweep_interval_s,
            watch_interval_s=settings.watch_interval_s,
        ),
        jobs=jobs,
    )
    telemetry.metrics.watch(lambda: function_states(node.schedulers(), holders()))
    telemetry.metrics.watch_devices(lambda: instance_devices(holders()))
    telemetry.metrics.watch_store(
        lambda: repository.store.requests, lambda: node.registry.lookups.refused
    )
    telemetry.metrics.watch_jobs(lambda: jobs.queued_records, lambda: jobs.running)
    spares = loader.spares
    if spares is not None:
        telemetry.metrics.watch_spares(lambda: spares.ready, lambda: spares.taken)
    return node


def on_devices(schedulers: Iterable[Any]) -> Iterator[tuple[Device, int]]:
    """(device, device bytes) of every loaded instance: what placement counts per GPU."""
    for s in schedulers:
        for instance in s.pool.loaded_instances():
            yield instance.device, instance.device_bytes


def function_states(schedulers: Iterable[Any], holding: Iterable[Any]) -> list[FunctionState]:
    """Warm instances, queue depth and batches running of every version held here
    (/metrics). One holding no instance (``holding``: those that hold or load one, as
    their pools tell) has none warm; its batches and sequences are still read, since
    one whose instance was lost may be ending them while the instance is let go."""
    held = set(map(id, holding))
    states = []
    for s in schedulers:
        pool = s.pool
        instances = pool.instances if id(s) in held else 0
        active = s.sequencer.active if s.sequencer else 0
        state = FunctionState(
            s.name, s.version.version, instances, s.batcher.queued, pool.running, active
        )
        states.append(state)
    return states


def instance_devices(schedulers: Iterable[Any]) -> list[tuple[str, str, str, int]]:
    """(function, version, device, instances there) of every loaded version (/metrics):
    ``schedulers``, those holding an instance."""
    rows: dict[tuple[str, str, str], int] = {}
    for s in schedulers:
        for instance in s.pool.loaded_instances():
            key = (s.version.name, s.version.version, str(instance.device))
            rows[key] = rows.get(key, 0) + 1
    return [(*key, count) for key, count in rows.items()]


def invoke_keys(settings: ServerSettings) -> InvokeKeys | None:
    """The settings' invoke keys, or None when invokes need no key."""
    if settings.invoke_keys_file is None:
        return None
    return InvokeKeys.load(settings.invoke_keys_file, settings.admin_token)


def _busy(s: Scheduler) -> bool:
    """A version with requests outstanding or an instance at work."""
    return bool(sched.outstanding(s)) or sched.activity(s).busy
