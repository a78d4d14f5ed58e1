"""The instances of one function version: the slots, running a batch, replacing.

The pool holds slots, each the place of one instance (in a thread or a worker
process: it does not care which, see ``fnrt.loader.launch.launch``), and is
the only one to change them. The first instance loads at the first request;
concurrent first requests share that one load. More start while the queue
stays deep, idle ones stop (the decisions: :class:`~fnrt.runtime.scaler.Scaler`).
An instance that dies or is killed fails only its batch; the pool replaces it
after a backoff that doubles while it keeps dying, and a failed load waits the
same backoff (loads: :class:`~fnrt.runtime.loads.Loads`). An instance whose
mapped files change is retired (:class:`~fnrt.runtime.watches.FileWatches`).
What calls find when they arrive is counted by :class:`~fnrt.runtime.starts.Starts`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from operator import attrgetter
from typing import Any, TypeVar

from fnrt.functions.errors import (
    FnrtError,
    HandlerFailed,
    HandlerTimeout,
    InstanceLost,
    InstanceStopped,
    WeightsChanged,
)
from fnrt.functions.generation import StepBatch, Stepped
from fnrt.functions.handler import Request
from fnrt.functions.version import VersionManifest
from fnrt.loader.instance import Ran, Runnable, add_first_batch
from fnrt.loader.memory import MakeRoom, no_room
from fnrt.loader.staging import Staged
from fnrt.runtime.clock import Clock
from fnrt.runtime.events import Events
from fnrt.runtime.loads import (
    LoadInstance,
    Loads,
    describe_failure,
    new_error_id,
    release_instance,
    remote_traceback,
)
from fnrt.runtime.scaler import Scaler
from fnrt.runtime.scaling import Activity
from fnrt.runtime.starts import Starts
from fnrt.runtime.stats import Stats
from fnrt.runtime.watches import FileWatches, WatchFiles
from fnrt.tracing.handler_spans import TraceParent

#: a slot running a batch (True counts 1 in a sum)
_RUNNING = attrgetter("running")
log = logging.getLogger("fnrt.pool")

__all__ = [
    "InstancePool",
    "InstanceState",
    "LoadInstance",
    "Slot",
    "WatchFiles",
    "describe_failure",
    "new_error_id",
    "remote_traceback",
    "run_failure",
]

R = TypeVar("R")


class InstanceState(StrEnum):
    COLD = "cold"
    LOADING = "loading"
    WARM = "warm"


@dataclass(eq=False)
class Slot:
    """One instance (or the place for one)."""

    index: int
    instance: Runnable | None = None
    loading: asyncio.Future[Runnable] | None = None
    running: bool = False
    last_active: float = 0.0
    retired: bool = False
    failures: int = 0  # loads failed or instances lost in a row (``Loads`` counts them)
    retry_at: float = 0.0  # no load before this clock time (backoff)
    backing_off: bool = False  # its load is waiting out the backoff
    running_future: asyncio.Future[Any] | None = field(default=None, repr=False)  # its batch
    stop_reason: str | None = None  # why its running batch is being stopped (stop_running)
    first_batch: bool = False  # its instance is new: its first batch is a cold start's stage
    #: while it loads, the worker instance its load message went to, once sent (a first
    #: batch may follow it: :meth:`InstancePool.ensure`); never set for a thread's load
    sent: asyncio.Future[Runnable] | None = field(default=None, repr=False)

    @property
    def primary(self) -> bool:
        return self.index == 0


class InstancePool:
    """Slots and instances of one function version."""

    def __init__(
        self,
        version: VersionManifest,
        load: LoadInstance,
        clock: Clock,
        stats: Stats,
        events: Events,
        make_room: MakeRoom | None = None,
        *,
        in_thread: bool = False,
        device_room: Callable[[], bool] | None = None,
        watch_files: WatchFiles | None = None,
    ) -> None:
        self.version = version
        #: its handler has forward (known from its first load): admission checks rows
        self.stages = False
        self.name = version.name
        self._clock = clock
        self._stats = stats
        self._events = events
        self._manifest = version.manifest
        self.slots: list[Slot] = []
        self._next_slot = 0
        self._background: set[asyncio.Future[Runnable]] = set()
        # A worker bounds its own batches; a thread's are bounded here.
        self._thread_timeout_s = self._manifest.isolation.timeout_s if in_thread else 0.0
        #: Called when slots change (one retired): the batcher's workers look again.
        self.changed: Callable[[], None] = lambda: None
        #: Told when it starts (True) and stops (False) holding or loading an instance:
        #: the node's memory budgets weigh those, and its sweep looks at those (with
        #: the ones it keeps for a rollback or has a plan for), not every version served.
        self.holding: Callable[[bool], None] | None = None
        self._holds = False
        #: its parts: what calls find, the loads, the scaling decisions, the file watches
        self.starts = Starts(self.name, self.slots, stats, events)
        self.loads = Loads(version, load, clock, stats, events, make_room)
        self._scaler = Scaler(self._manifest, device_room)
        retire = functools.partial(self._retire_changed, reload=True)
        self._watches = FileWatches(version, watch_files, retire)
        self._add_slot()  # the first instance's place: its queue's first loop serves it

    # --- what it holds -----------------------------------------------------------------

    def _held(self) -> None:
        """After a slot's instance or load came or went: :attr:`holding` told of a change
        (it is cold exactly while it holds and loads none)."""
        holds = any(s.instance is not None or s.loading is not None for s in self.slots)
        if holds is not self._holds:
            self._holds = holds
            if self.holding is not None:
                self.holding(holds)

    @property
    def state(self) -> InstanceState:
        if any(s.instance is not None for s in self.slots):
            return InstanceState.WARM
        if any(s.loading is not None for s in self.slots):
            return InstanceState.LOADING
        return InstanceState.COLD

    @property
    def instances(self) -> int:
        return sum(1 for s in self.slots if s.instance is not None)

    def loaded_instances(self) -> list[Runnable]:
        return [s.instance for s in self.slots if s.instance is not None]

    @property
    def instance_bytes(self) -> int:
        """Memory the loaded instances hold (0 when cold): a worker that died while idle
        (killed for memory, say) holds none, though its slot keeps it until a call finds
        it gone."""
        return sum(i.size_bytes for i in self.loaded_instances() if i.alive)

    @property
    def device_bytes(self) -> int:
        """GPU memory the loaded instances hold (0 when cold, or on the CPU; none for a
        worker that died)."""
        return sum(i.device_bytes for i in self.loaded_instances() if i.alive)

    @property
    def running(self) -> int:
        """Batches running now (a scrape reads it of every version a node holds)."""
        return sum(map(_RUNNING, self.slots))

    def activity(self, queued: int) -> Activity:
        """The version as a whole (any instance loaded, any busy)."""
        return Activity(
            loaded=self.instances > 0,
            busy=any(s.running or s.loading is not None for s in self.slots),
            queued=queued,
            last_active_s=max((s.last_active for s in self.slots), default=0.0),
        )

    # --- loading -----------------------------------------------------------------------

    def _add_slot(self) -> Slot:
        slot = Slot(self._next_slot, last_active=self._clock.now())
        self._next_slot += 1
        self.slots.append(slot)
        return slot

    async def ensure(self, slot: Slot, sent: Callable[[Runnable], None] | None = None) -> Runnable:
        """The slot's instance, loaded now if there is none (shares a load under way). One
        found dead (a worker killed while idle) is replaced first, as a batch that lost
        it would have replaced it, and the batch waits for the new one. ``sent`` is
        called, on the loop, with a worker instance as soon as its load message is sent,
        for a first batch to follow it while the worker loads
        (``ProcessInstance.send_early``): not for a thread's load, which sends nothing,
        nor once the load has sent it."""
        instance = slot.instance
        if instance is not None:
            if self._watches.found(slot) is not None:
                await self._retire_changed(slot, instance, reload=False)
                return await self.ensure(slot, sent)
            if instance.alive:
                return instance
            lost = await asyncio.to_thread(instance.ended)
            if slot.instance is instance:  # not replaced meanwhile by another caller
                await self._lose(slot, instance, lost)
            return await self.ensure(slot, sent)
        if slot.loading is None:
            slot.sent = asyncio.get_running_loop().create_future()
            slot.loading = asyncio.ensure_future(self._load(slot))
            self._held()
        if sent is not None and slot.sent is not None and not slot.sent.done():
            slot.sent.add_done_callback(functools.partial(_told, sent))
        return await asyncio.shield(slot.loading)

    def load_in_background(self, slot: Slot) -> None:
        future = asyncio.ensure_future(self.ensure(slot))
        self._background.add(future)
        future.add_done_callback(_quiet)
        future.add_done_callback(self._background.discard)

    async def _load(self, slot: Slot) -> Runnable:
        """Load the slot's instance, start the watch on its files and put it in the slot:
        loading until then (a ``close`` meanwhile waits for it, and then unloads it)."""
        release = no_room  # what gives back the memory room held for the load
        try:
            try:
                loaded = await self.loads.load(slot, self._watches.open, slot.sent)
            except FnrtError:
                if not slot.primary:  # an extra slot whose load failed is given up: the
                    slot.retired = True  # others serve (and the queue may ask for another)
                    if slot in self.slots:
                        self.slots.remove(slot)
                    self.changed()
                raise
            instance, watch, started_ns, release = loaded
            self._watches.adopt(slot, instance, watch)
            slot.instance = instance
        finally:
            slot.loading = None
            if slot.sent is not None:
                slot.sent.cancel()  # (a load that sent nothing: nobody waits for it now)
                slot.sent = None
            self._held()
            release()  # counted as the slot's now (or given up)
        slot.first_batch = True
        slot.last_active = self._clock.now()
        self.stages = instance.stages
        self.loads.loaded(slot, instance, started_ns)
        return instance

    async def _retire_changed(self, slot: Slot, instance: Runnable, *, reload: bool) -> None:
        """Stop using an instance whose mapped files changed; load again (from a verified
        copy: the disk cache fetches it again, a folder store refuses a changed blob)."""
        if slot.instance is not instance:
            return
        slot.instance = None
        self._held()
        reason = self._watches.stop(slot) or "its files changed"
        self._stats.restarts["changed"] += 1
        self._stats.last_restart_reason = reason
        self._events.lost(self.version, "changed")
        log.error(
            "%s %s retired instance %d: %s", self.name, self.version.version, slot.index, reason
        )
        await asyncio.to_thread(release_instance, instance)
        self.changed()
        if reload and not slot.retired:
            self.load_in_background(slot)

    # --- running -----------------------------------------------------------------------

    async def run(
        self,
        slot: Slot,
        instance: Runnable,
        batch: list[Request],
        trace: TraceParent | None = None,
    ) -> Ran:
        """Run one batch on the slot's instance. An instance lost on the way (it died,
        or ran past ``timeout_s``) is replaced; its InstanceLost is raised."""
        running = instance.run_soon(batch, trace)
        if instance.apart:  # sent: the loop is free until the worker answers
            self._events.waiting()
        return await self._on_instance(slot, instance, running)

    async def run_staged(
        self, slot: Slot, instance: Runnable, staged: Staged, trace: TraceParent | None = None
    ) -> Ran:
        """Compute a batch staged ahead, as :meth:`run` runs one."""
        running = instance.run_staged_soon(staged, trace)
        if instance.apart:
            self._events.waiting()
        return await self._on_instance(slot, instance, running)

    async def step(
        self, slot: Slot, instance: Runnable, batch: StepBatch, trace: TraceParent | None = None
    ) -> Stepped:
        """Run one step of a generative handler on the slot's instance, as :meth:`run`
        runs a batch (``timeout_s`` bounds one step)."""
        return await self._on_instance(slot, instance, instance.step_soon(batch, trace))

    async def _on_instance(self, slot: Slot, instance: Runnable, ran: asyncio.Future[R]) -> R:
        """Wait for ``ran``, a batch or step started on the slot's instance."""
        slot.running = True
        first, slot.first_batch = slot.first_batch, False
        began = time.perf_counter() if first else 0.0
        try:
            slot.running_future = ran
            if self._thread_timeout_s:  # a worker process times its batches itself
                bound = asyncio.timeout(self._thread_timeout_s)
                try:
                    async with bound:
                        result = await ran
                except TimeoutError:
                    if not bound.expired():  # the handler's own TimeoutError
                        raise
                    raise HandlerTimeout(self.name, "", self._thread_timeout_s) from None
            else:
                result = await ran
            changed = self._watches.found(slot)  # before the batch ended (or now)
            if changed is not None:
                await self._retire_changed(slot, instance, reload=True)
                raise WeightsChanged(self.name, changed)
        except InstanceLost as exc:
            await self._lose(slot, instance, exc)
            raise
        except asyncio.CancelledError:
            reason = slot.stop_reason
            if reason is None:  # the batcher's own task was cancelled
                raise
            slot.stop_reason = None
            await self._stopped(slot, instance)
            raise InstanceStopped(self.name, reason) from None
        finally:
            slot.running = False
            slot.running_future = None
            slot.last_active = self._clock.now()
        slot.failures = 0
        if first:  # the last stage of its cold start (lazy set-up, warm-up: the handler's)
            latest = self._stats.last_load_timings_s == instance.timings_s
            add_first_batch(instance.timings_s, time.perf_counter() - began)
            if latest:  # describe shows the last load's stages
                self._stats.last_load_timings_s = dict(instance.timings_s)
            self._events.first_batch(self.version, instance)
        return result

    def stop_running(self, reason: str) -> int:
        """Stop every batch running now (a handler that may never return): its requests
        get InstanceStopped (503), its instance is abandoned and not restarted. The
        number of batches stopped."""
        stopped = 0
        for slot in self.slots:
            running = slot.running_future
            if running is not None and not running.done():
                slot.stop_reason = reason
                running.cancel()  # the thread runs on, if it must; nobody waits for it
                stopped += 1
        return stopped

    async def _stopped(self, slot: Slot, instance: Runnable) -> None:
        if slot.instance is instance:
            slot.instance = None
            self._held()
            self._watches.stop(slot)
        self._stats.unloads += 1
        log.warning(
            "%s %s: stopped instance %d while it ran a batch",
            self.name,
            self.version.version,
            slot.index,
        )
        await asyncio.to_thread(instance.abandon)
        self.changed()

    async def _lose(self, slot: Slot, instance: Runnable, error: InstanceLost) -> None:
        if slot.instance is instance:
            slot.instance = None
            self._held()
            self._watches.stop(slot)
        self._stats.restarts[error.cause] += 1
        self._stats.last_restart_reason = error.message
        self._events.lost(self.version, error.cause)
        log.error(
            "%s %s lost instance %d: %s", self.name, self.version.version, slot.index, error.message
        )
        await asyncio.to_thread(instance.abandon)
        self.loads.failed(slot, error.cause, error.message)
        if not slot.retired:  # restart it now (after the backoff), not at the next request
            self.load_in_background(slot)

    # --- scaling -----------------------------------------------------------------------

    def scale_up(self, queued: int, now: float, batch_size: int | None = None) -> Slot | None:
        """One more slot, its instance loading, when the queue has been deep long enough
        (deep: a batch of ``batch_size``, by default ``max_batch_size``, waits); None
        while it has not. The queue starts a loop that serves the new slot."""
        loading = any(s.loading is not None for s in self.slots)
        if not self._scaler.wants_another(self.slots, loading, queued, now, batch_size):
            return None
        slot = self._add_slot()
        log.info("scaling %s up to %d instances", self.name, len(self.slots))
        self.load_in_background(slot)
        return slot

    async def scale_to_zero(
        self, now: float, queued: int, *, force: bool = False, keep_primary: bool = False
    ) -> bool:
        """Drop idle instances: extra ones after ``scale_down_after_s``, the last after
        ``keep_alive_s`` (never below ``min_instances``); ``force`` drops every idle
        one now. True if any was dropped."""
        idle = self._scaler.idle(self.slots, queued, now, force=force, keep_primary=keep_primary)
        for slot in idle:
            await self.drop(slot)
        return bool(idle)

    async def drop(self, slot: Slot) -> None:
        instance, slot.instance = slot.instance, None
        if instance is None:
            return
        self._held()
        self._watches.stop(slot)
        self._stats.unloads += 1
        if slot.primary:  # a miss if it was loaded ahead and never used
            self.starts.dropped()
        if not slot.primary:
            slot.retired = True
            self.slots.remove(slot)
            self.changed()
        log.info("unloaded %s %s (instance %d)", self.name, self.version.version, slot.index)
        await asyncio.to_thread(release_instance, instance)

    async def close(self) -> None:
        """Wait for loads under way, then unload every instance."""
        for future in list(self._background):
            future.cancel()
        for slot in list(self.slots):
            slot.retired = True
            if slot.loading is not None and slot.backing_off:
                slot.loading.cancel()  # nothing started yet: no need to wait the backoff out
            if slot.loading is not None:
                with contextlib.suppress(BaseException):
                    await slot.loading
                slot.loading = None
                self._held()
            if slot.instance is not None:
                await self.drop(slot)


def run_failure(exc: Exception, vm: VersionManifest, what: str) -> FnrtError:
    """What the requests of a failed batch (or step: ``what`` names it, for the log) are
    answered with: the stop or loss as it is (the pool logged it), else HandlerFailed
    with an error id the logged traceback carries."""
    if isinstance(exc, InstanceStopped):
        return exc  # an unload or a shutdown stopped it: 503, logged by the pool
    error_id = new_error_id()
    if isinstance(exc, InstanceLost):
        exc.error_id = error_id
        exc.fields["error_id"] = error_id
        return exc  # logged by the pool, with its cause
    log.error(
        "function %s %s failed on %s (error id %s)%s",
        vm.name,
        vm.version,
        what,
        error_id,
        remote_traceback(exc),
        exc_info=exc,
    )
    return HandlerFailed(vm.name, error_id, describe_failure(exc))


def _told(sent: Callable[[Runnable], None], future: asyncio.Future[Runnable]) -> None:
    """Call ``sent`` with the instance a load message went to (not when none was)."""
    if not future.cancelled():
        sent(future.result())


def _quiet(future: asyncio.Future[Runnable]) -> None:
    """Retrieve a background load's error (it is logged where it happened)."""
    if not future.cancelled():
        future.exception()
