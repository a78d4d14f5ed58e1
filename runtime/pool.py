"""The instances of one function version: loading, running a batch, replacing, scaling.

The pool holds slots, each the place of one instance (in a thread or a worker
process: it does not care which, see ``fnrt.loader.process.launch``). The
first instance loads at the first request; concurrent first requests share
that one load. More start while the queue stays deep (the pure
:func:`~fnrt.runtime.scaling.should_add_instance`), idle ones stop
(:func:`~fnrt.runtime.scaling.should_unload`). An instance that dies or is
killed fails only its batch; the pool replaces it after a backoff that
doubles while it keeps dying, and a failed load waits the same backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from fnrt.functions.errors import (
    FnrtError,
    HandlerFailed,
    HandlerTimeout,
    InstanceLost,
    InstanceStopped,
    LoadError,
    WeightsChanged,
)
from fnrt.functions.generation import StepBatch, Stepped
from fnrt.functions.handler import Request
from fnrt.functions.version import VersionManifest
from fnrt.loader.instance import Ran, Runnable
from fnrt.loader.memory import MakeRoom
from fnrt.loader.scrub import Watch
from fnrt.loader.staging import Staged
from fnrt.runtime.clock import Clock
from fnrt.runtime.events import Events, PrewarmOutcome, StartKind
from fnrt.runtime.scaling import Activity, should_add_instance, should_unload
from fnrt.runtime.stats import Stats
from fnrt.tracing.handler_spans import TraceParent

log = logging.getLogger("fnrt.pool")

#: Builds one instance of a version on the executor's thread (``launch`` by default).
LoadInstance = Callable[[VersionManifest, Executor], Runnable]
#: Starts watching the files a version's instance maps, after its load (blocking; None:
#: nothing watches them). ``InstanceLoader.watch_files``.
WatchFiles = Callable[[VersionManifest], Watch | None]
R = TypeVar("R")


class InstanceState(StrEnum):
    COLD = "cold"
    LOADING = "loading"
    WARM = "warm"


def new_error_id() -> str:
    return uuid.uuid4().hex[:16]


def describe_failure(exc: BaseException) -> str:
    """``Type: message`` of a handler's exception (a worker's arrives that way already)."""
    reason = getattr(exc, "reason", None)
    return reason if isinstance(reason, str) else f"{type(exc).__name__}: {exc}"


@dataclass(eq=False)
class Slot:
    """One instance (or the place for one)."""

    index: int
    instance: Runnable | None = None
    loading: asyncio.Future[Runnable] | None = None
    running: bool = False
    last_active: float = 0.0
    retired: bool = False
    failures: int = 0  # loads failed or instances lost in a row
    retry_at: float = 0.0  # no load before this clock time (backoff)
    backing_off: bool = False  # its load is waiting out the backoff
    worker: asyncio.Task[None] | None = field(default=None, repr=False)  # the batcher's
    running_future: asyncio.Future[Any] | None = field(default=None, repr=False)  # its batch
    stop_reason: str | None = None  # why its running batch is being stopped (stop_running)
    watch: Watch | None = None  # the files its instance maps (loader/scrub.py)

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
        self._watch_files = watch_files
        self._device_room = device_room  # None: no cap on instances sharing the GPU
        #: its handler has forward (known from its first load): admission checks rows
        self.stages = False
        self.name = version.name
        self._load_instance = load
        self._clock = clock
        self._stats = stats
        self._events = events
        self._make_room = make_room
        self._manifest = version.manifest
        self.slots: list[Slot] = []
        self._next_slot = 0
        self._deep_since: float | None = None
        self._prewarmed_at: float | None = None  # a pre-warmed instance no call has used yet
        self._background: set[asyncio.Future[Runnable]] = set()
        self._retiring: set[asyncio.Future[None]] = set()  # instances whose files changed
        # A worker bounds its own batches; a thread's are bounded here.
        self._thread_timeout_s = self._manifest.isolation.timeout_s if in_thread else 0.0
        #: Called when slots change (one retired): the batcher's workers look again.
        self.changed: Callable[[], None] = lambda: None
        #: Called when an instance died (its cause: ``signal``, ``timeout``...) or a load
        #: failed on the handler's side (``load``), with the clock time before which the
        #: slot loads none again (the backoff) and why: the breaker counts deaths in a row.
        self.died: Callable[[str, float, str], None] = lambda cause, retry_at, reason: None

    # --- what it holds -----------------------------------------------------------------

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

    def _any_loaded(self) -> bool:
        for slot in self.slots:  # noqa: SIM110 (no generator frame: this runs per request)
            if slot.instance is not None:
                return True
        return False

    def loaded_instances(self) -> list[Runnable]:
        return [s.instance for s in self.slots if s.instance is not None]

    @property
    def instance_bytes(self) -> int:
        """Memory the loaded instances hold (0 when cold)."""
        return sum(s.instance.size_bytes for s in self.slots if s.instance is not None)

    @property
    def device_bytes(self) -> int:
        """GPU memory the loaded instances hold (0 when cold, or on the CPU)."""
        return sum(s.instance.device_bytes for s in self.slots if s.instance is not None)

    def restarts_by_cause(self) -> dict[str, int]:
        """Instances lost and replaced, by cause (signal, exit, memory, timeout)."""
        return dict(self._stats.restarts)

    @property
    def running(self) -> int:
        """Batches running now."""
        return sum(1 for s in self.slots if s.running)

    def activity(self, queued: int) -> Activity:
        """The version as a whole (any instance loaded, any busy)."""
        return Activity(
            loaded=self.instances > 0,
            busy=any(s.running or s.loading is not None for s in self.slots),
            queued=queued,
            last_active_s=max((s.last_active for s in self.slots), default=0.0),
        )

    # --- starts and pre-warms ----------------------------------------------------------

    def count_start(self, now: float) -> StartKind:
        """What a call arriving now finds: a loaded instance, a pre-warmed one, or none."""
        if not self._any_loaded():
            kind = StartKind.COLD
            self._prewarmed_at = None  # a pre-warm still loading: this call waits for it
        elif self._prewarmed_at is not None:
            kind = StartKind.PREWARMED
            self._stats.last_prewarm_lead_s = now - self._prewarmed_at
            self._prewarmed_at = None
            self._stats.prewarms[PrewarmOutcome.HIT] += 1
            self._events.prewarmed(self.name, PrewarmOutcome.HIT)
        else:
            kind = StartKind.WARM
        self._stats.starts[kind] += 1
        self._events.started(self.name, kind)
        return kind

    async def prewarm(self) -> bool:
        """Load ahead of a predicted call; False when it was loaded already."""
        if self.instances:
            return False
        # marked before the load: a call may arrive in the turn between the instance
        # being set and this resuming, and it must count as pre-warmed
        self._prewarmed_at = self._clock.now()
        try:
            await self.ensure(self.slots[0])
        except BaseException:
            self._prewarmed_at = None
            raise
        return True

    # --- loading -----------------------------------------------------------------------

    def add_slot(self) -> Slot:
        slot = Slot(self._next_slot, last_active=self._clock.now())
        self._next_slot += 1
        self.slots.append(slot)
        return slot

    async def ensure(self, slot: Slot) -> Runnable:
        """The slot's instance, loaded now if there is none (shares a load under way). One
        found dead (a worker killed while idle) is replaced first, as a batch that lost
        it would have replaced it, and the batch waits for the new one."""
        instance = slot.instance
        if instance is not None:
            if slot.watch is not None and slot.watch.check() is not None:
                await self._retire_changed(slot, instance, reload=False)
                return await self.ensure(slot)
            if instance.alive:
                return instance
            lost = await asyncio.to_thread(instance.ended)
            if slot.instance is instance:  # not replaced meanwhile by another caller
                await self._lose(slot, instance, lost)
            return await self.ensure(slot)
        if slot.loading is None:
            slot.loading = asyncio.ensure_future(self._load(slot))
        return await asyncio.shield(slot.loading)

    def load_in_background(self, slot: Slot) -> None:
        future = asyncio.ensure_future(self.ensure(slot))
        self._background.add(future)
        future.add_done_callback(_quiet)
        future.add_done_callback(self._background.discard)

    async def _load(self, slot: Slot) -> Runnable:
        delay = slot.retry_at - self._clock.now()
        if delay > 0:  # backing off after failures
            slot.backing_off = True
            try:
                await self._clock.sleep(delay)
            finally:
                slot.backing_off = False
        started_ns = time.time_ns()
        executor = ThreadPoolExecutor(1, thread_name_prefix=f"fnrt-{self.name}-{slot.index}")
        loop = asyncio.get_running_loop()
        stats = self._stats
        try:
            if self._make_room is not None:
                key = f"{self.name}/{self.version.version}"
                size = self.version.size_bytes  # until a load says what it holds where
                await self._make_room(
                    key, stats.last_load_bytes or size, stats.last_load_device_bytes or size
                )
            instance = await loop.run_in_executor(
                executor, self._load_instance, self.version, executor
            )
        except BaseException as exc:
            executor.shutdown(wait=False)
            stats.load_failures += 1
            if isinstance(exc, FnrtError) and not isinstance(exc, InstanceLost):
                stats.last_load_error = exc.message  # the store's or the manifest's: no backoff
                raise
            # the handler's own failure: the next load backs off
            self._failed(slot, "load", describe_failure(exc))
            error_id = new_error_id()
            log.error(
                "loading %s %s failed (error id %s)%s",
                self.name,
                self.version.version,
                error_id,
                remote_traceback(exc),
                exc_info=exc,
            )
            error = LoadError(self.name, error_id, describe_failure(exc))
            stats.last_load_error = error.message
            raise error from exc
        finally:
            slot.loading = None
        if self._watch_files is not None:
            await self._watch(slot, instance, loop)
        slot.instance = instance
        stats.last_load_error = None
        # A full collection walks every object torch and the model made (~100 ms
        # with torch loaded): freeze them out of the collector so per-request
        # garbage never triggers such a pause (the p99 of a busy function).
        gc.freeze()
        slot.last_active = self._clock.now()
        stats.loads += 1
        stats.last_load_timings_s = dict(instance.timings_s)
        stats.last_load_tier = instance.tier
        stats.last_load_bytes = instance.size_bytes
        stats.last_load_device_bytes = instance.device_bytes
        self.stages = instance.stages
        stats.cold_starts[instance.tier] += 1
        self._events.loaded(self.version, instance, started_ns, time.time_ns())
        log.info(
            "loaded %s %s (instance %d, %s) in %.3fs",
            self.name,
            self.version.version,
            slot.index,
            instance.tier,
            instance.timings_s["total_s"],
        )
        return instance

    async def _watch(self, slot: Slot, instance: Runnable, loop: asyncio.AbstractEventLoop) -> None:
        """Watch the files the new instance maps; a change found retires it at once."""
        assert self._watch_files is not None
        watch = await asyncio.to_thread(self._watch_files, self.version)
        if watch is None:
            return
        slot.watch = watch

        def changed(reason: str) -> None:  # from the scrub's thread
            loop.call_soon_threadsafe(self._changed_under, slot, instance)

        watch.on_change = changed

    def _changed_under(self, slot: Slot, instance: Runnable) -> None:
        """A file the instance maps changed: an idle instance is retired now (a running
        one when its batch ends, whose answers are not served)."""
        if slot.instance is instance and not slot.running:
            future = asyncio.ensure_future(self._retire_changed(slot, instance, reload=True))
            self._retiring.add(future)
            future.add_done_callback(self._retiring.discard)

    async def _retire_changed(self, slot: Slot, instance: Runnable, *, reload: bool) -> None:
        """Stop using an instance whose mapped files changed; load again (from a verified
        copy: the disk cache fetches it again, a folder store refuses a changed blob)."""
        if slot.instance is not instance:
            return
        watch, slot.instance, slot.watch = slot.watch, None, None
        reason = watch.reason if watch is not None and watch.reason else "its files changed"
        self._unwatch(watch)
        self._stats.restarts["changed"] += 1
        self._stats.last_restart_reason = reason
        self._events.lost(self.version, "changed")
        log.error(
            "%s %s retired instance %d: %s", self.name, self.version.version, slot.index, reason
        )
        await asyncio.to_thread(_release, instance)
        self.changed()
        if reload and not slot.retired:
            self.load_in_background(slot)

    def _unwatch(self, watch: Watch | None) -> None:
        if watch is not None:
            watch.close()

    def _failed(self, slot: Slot, cause: str, reason: str) -> None:
        """One more failure in a row: the next load of the slot waits the backoff."""
        slot.failures += 1
        slot.retry_at = self._clock.now() + self._manifest.isolation.backoff_s(slot.failures)
        self.died(cause, slot.retry_at, reason)

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
        return await self._on_instance(slot, instance, instance.run_soon(batch, trace))

    async def stage(self, instance: Runnable, batch: list[Request]) -> Staged:
        """Stage a batch ahead while the instance may be computing another: stacked and on
        its way to the device on its host lane (a thread instance of a handler with
        ``forward``), or written into a worker's second request arena and sent."""
        return await instance.stage_soon(batch)

    async def run_staged(
        self, slot: Slot, instance: Runnable, staged: Staged, trace: TraceParent | None = None
    ) -> Ran:
        """Compute a batch staged ahead, as :meth:`run` runs one."""
        return await self._on_instance(slot, instance, instance.run_staged_soon(staged, trace))

    async def step(
        self, slot: Slot, instance: Runnable, batch: StepBatch, trace: TraceParent | None = None
    ) -> Stepped:
        """Run one step of a generative handler on the slot's instance, as :meth:`run`
        runs a batch (``timeout_s`` bounds one step)."""
        return await self._on_instance(slot, instance, instance.step_soon(batch, trace))

    async def _on_instance(self, slot: Slot, instance: Runnable, ran: asyncio.Future[R]) -> R:
        """Wait for ``ran``, a batch or step started on the slot's instance."""
        slot.running = True
        try:
            slot.running_future = ran
            if self._thread_timeout_s:  # a worker process times its batches itself
                try:
                    result = await asyncio.wait_for(ran, self._thread_timeout_s)
                except TimeoutError:
                    raise HandlerTimeout(self.name, "", self._thread_timeout_s) from None
            else:
                result = await ran
            if slot.watch is not None and slot.watch.check() is not None:
                changed = slot.watch.reason or ""  # found before the batch ended (or now)
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
            self._unwatch(slot.watch)
            slot.watch = None
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
            self._unwatch(slot.watch)
            slot.watch = None
        self._stats.restarts[error.cause] += 1
        self._stats.last_restart_reason = error.message
        self._events.lost(self.version, error.cause)
        log.error(
            "%s %s lost instance %d: %s", self.name, self.version.version, slot.index, error.message
        )
        await asyncio.to_thread(instance.abandon)
        self._failed(slot, error.cause, error.message)
        if not slot.retired:  # restart it now (after the backoff), not at the next request
            self.load_in_background(slot)

    # --- scaling -----------------------------------------------------------------------

    def wants_another(self, queued: int, now: float, batch_size: int | None = None) -> bool:
        """Whether the queue has been deep long enough for one more instance (deep: a
        batch of ``batch_size``, by default ``max_batch_size``, waits)."""
        scaling = self._manifest.scaling
        size = batch_size or self._manifest.batching.max_batch_size
        if queued >= size:
            self._deep_since = self._deep_since if self._deep_since is not None else now
        else:
            self._deep_since = None
        if self._device_room is not None and not self._device_room():
            return False  # --gpu-concurrency: the GPU has as many instances as it shares
        return should_add_instance(
            scaling,
            instances=len(self.slots),
            loading=any(s.loading is not None for s in self.slots),
            queued=queued,
            batch_size=size,
            deep_since_s=self._deep_since,
            now=now,
        )

    async def scale_to_zero(
        self, now: float, queued: int, *, force: bool = False, keep_primary: bool = False
    ) -> bool:
        """Drop idle instances: extra ones after ``scale_down_after_s``, the last after
        ``keep_alive_s`` (never below ``min_instances``); ``force`` drops every idle
        one now. True if any was dropped."""
        scaling = self._manifest.scaling
        dropped = False
        for slot in sorted(self.slots, key=lambda s: -s.index):
            if slot.instance is None:
                continue
            if not force and self.instances <= scaling.min_instances:
                break
            if slot.primary and keep_primary:
                continue  # the keep-alive policy decides for the first instance
            keep = scaling.keep_alive_s if slot.primary else scaling.scale_down_after_s
            activity = Activity(True, slot.running, queued, slot.last_active)
            idle = not activity.busy and not activity.queued
            if (force and idle) or should_unload(keep, activity, now):
                await self.drop(slot)
                dropped = True
        return dropped

    async def drop(self, slot: Slot) -> None:
        instance, slot.instance = slot.instance, None
        if instance is None:
            return
        self._unwatch(slot.watch)
        slot.watch = None
        self._stats.unloads += 1
        if self._prewarmed_at is not None and slot.primary:  # loaded ahead, never used
            self._prewarmed_at = None
            self._stats.prewarms[PrewarmOutcome.MISS] += 1
            self._events.prewarmed(self.name, PrewarmOutcome.MISS)
        if not slot.primary:
            slot.retired = True
            self.slots.remove(slot)
            self.changed()
        log.info("unloaded %s %s (instance %d)", self.name, self.version.version, slot.index)
        await asyncio.to_thread(_release, instance)

    def retire(self, slot: Slot) -> None:
        """Give up an extra slot whose load failed (the others serve)."""
        slot.retired = True
        if slot in self.slots:
            self.slots.remove(slot)

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


def remote_traceback(exc: BaseException) -> str:
    """A worker's traceback of ``exc`` to append to a log line ("" for local errors)."""
    text = getattr(exc, "remote_traceback", "")
    return f"\nin the worker:\n{text}" if text else ""


def _quiet(future: asyncio.Future[Runnable]) -> None:
    """Retrieve a background load's error (it is logged where it happened)."""
    if not future.cancelled():
        future.exception()


def _release(instance: Runnable) -> None:
    """Close an instance and collect what it held (runs off the event loop).

    The instance's objects were frozen after its load; unfreeze so the one full
    collection here can free any reference cycles among them, then freeze again.
    """
    instance.close()
    del instance
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():  # what it held on the GPU, back
        torch.cuda.empty_cache()
