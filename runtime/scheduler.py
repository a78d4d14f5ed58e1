"""One scheduler per deployed function version: admission, batching, instances.

Requests are admitted into a bounded :class:`RequestQueue` (per function and,
through :class:`Admission`, per node; beyond either, Overloaded -> 429 with
``Retry-After``). Each instance has a worker task that takes batches off the
shared queue as the batching decision says (fixed or adaptive), runs the
handler on the instance's own thread (the event loop never runs model code)
and answers each request. The first instance loads at the first request;
concurrent first requests share that one load. More instances start while the
queue stays deep, up to ``max_instances``; idle ones stop, down to zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from fnrt.functions.errors import (
    DeadlineExceeded,
    FnrtError,
    HandlerFailed,
    LoadError,
    Overloaded,
    Unavailable,
    VersionRetired,
)
from fnrt.functions.handler import Request
from fnrt.functions.version import VersionManifest
from fnrt.loader.instance import Instance, InstanceLoader, Ran
from fnrt.runtime.batching import (
    CostModel,
    Plan,
    RateEstimator,
    adaptive_plan,
    flush_delay_s,
    predicted_finish_s,
)
from fnrt.runtime.breaker import Breaker
from fnrt.runtime.clock import Clock
from fnrt.runtime.outcomes import OutcomeWindow
from fnrt.runtime.queue import Outputs, Pending, Priority, RequestQueue
from fnrt.runtime.result_cache import ResultCache, inputs_key
from fnrt.runtime.scaling import Activity, should_add_instance, should_unload
from fnrt.runtime.stats import Stats
from fnrt.tracing.spans import fail
from fnrt.tracing.telemetry import Telemetry

log = logging.getLogger("fnrt.scheduler")

_LAST_RESULT_TTL_S = 24 * 3600.0


#: Builds one instance of a version on the executor's thread (``InstanceLoader.load``).
LoadInstance = Callable[[VersionManifest, ThreadPoolExecutor], Instance]


class InstanceState(Enum):
    COLD = "cold"
    LOADING = "loading"
    WARM = "warm"


def new_error_id() -> str:
    return uuid.uuid4().hex[:16]


@dataclass(frozen=True)
class Served:
    """A request's outputs; the tier its instance was loaded from if it waited for a load."""

    outputs: Outputs
    cold_tier: str | None = None
    cached: bool = False  # answered from the result cache
    fallback: str | None = None  # "cache" or "function:NAME" when the breaker was open


#: Failures on the server's side: they count against a version (breaker, canary).
SERVER_FAILURES = (HandlerFailed, LoadError, DeadlineExceeded)


@dataclass(frozen=True)
class Failure:
    """A failed request kept for analysis: when, why, and its inputs."""

    at_unix_s: float
    error: dict[str, Any]
    inputs: Request


class Admission:
    """The node-wide bound on queued requests, shared by every scheduler."""

    def __init__(self, max_queued: int) -> None:
        self.max_queued = max_queued
        self.queued = 0


#: Called before a load with (the scheduler, bytes it expects to need); frees memory.
MakeRoom = Callable[["Scheduler", int], Awaitable[None]]


@dataclass(eq=False)
class _Slot:
    """One instance (or the place for one) and its worker."""

    index: int
    instance: Instance | None = None
    loading: asyncio.Future[Instance] | None = None
    running: bool = False
    last_active: float = 0.0
    retired: bool = False
    worker: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def primary(self) -> bool:
        return self.index == 0


class Scheduler:
    """Queue, batcher and instances of one function version."""

    def __init__(
        self,
        version: VersionManifest,
        loader: InstanceLoader,
        clock: Clock,
        make_room: MakeRoom | None = None,
        admission: Admission | None = None,
        telemetry: Telemetry | None = None,
        load: LoadInstance | None = None,
    ) -> None:
        self.version = version
        # What builds an instance: the handler by default; a split's tail (runtime/split.py).
        self._load_instance: LoadInstance = load or loader.load
        self._telemetry = telemetry
        self._prewarmed_at: float | None = None  # a pre-warmed instance no call has used yet
        self._load_span: tuple[int, int, dict[str, Any]] | None = None  # last load, for spans
        self._manifest = version.manifest
        self._loader = loader
        self._clock = clock
        self._make_room = make_room
        self._admission = admission or Admission(1 << 62)
        requests = self._manifest.requests
        self.default_priority = Priority.parse(requests.default_priority)
        self._queue = RequestQueue(requests.aging_ms / 1000.0)
        self._wake = asyncio.Event()
        self._closing = False
        self._deep_since: float | None = None
        self._next_slot = 0
        self._slots: list[_Slot] = []
        self.cost = CostModel()
        self.arrivals = RateEstimator()
        self.stats = Stats()
        caching = self._manifest.result_cache
        self.result_cache = (
            ResultCache(caching.max_bytes, caching.ttl_s, clock) if caching.enabled else None
        )
        breaker = self._manifest.breaker
        self.breaker = Breaker(breaker)
        self.outcomes = OutcomeWindow()  # read by the canary judge
        self.failures: deque[Failure] = deque(maxlen=breaker.failed_inputs_kept)
        # The last result per input, answered while the breaker is open (fallback "cache").
        self.last_results = (
            ResultCache(breaker.cache_bytes, _LAST_RESULT_TTL_S, clock)
            if breaker.fallback == "cache"
            else None
        )
        self._add_slot()

    # --- public ----------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._manifest.name

    @property
    def state(self) -> InstanceState:
        if any(s.instance is not None for s in self._slots):
            return InstanceState.WARM
        if any(s.loading is not None for s in self._slots):
            return InstanceState.LOADING
        return InstanceState.COLD

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def instances(self) -> int:
        return sum(1 for s in self._slots if s.instance is not None)

    def loaded_instances(self) -> list[Instance]:
        return [s.instance for s in self._slots if s.instance is not None]

    @property
    def instance_bytes(self) -> int:
        """Memory the loaded instances hold (0 when cold)."""
        return sum(s.instance.size_bytes for s in self._slots if s.instance is not None)

    async def submit(
        self,
        inputs: Request,
        *,
        priority: Priority | None = None,
        timeout_s: float | None = None,
        span: Any = None,
    ) -> Served:
        """Answer one request: from the result cache, or queued and computed.

        ``span`` is the request's server span (tracing on): its queue wait, the
        load it waited for and its batch are reported against it.

        Raises Overloaded (queue full), Unavailable (closing, or in adaptive
        mode a request that cannot finish within the target), DeadlineExceeded
        (``timeout_s`` passed before it was computed).
        """
        now = self._clock.now()
        totals = self.stats.totals
        cache, key = self.result_cache, ""
        if cache is not None:
            key = inputs_key(inputs)
            hit = cache.get(key)
            looked_up = self._clock.now() - now
            if hit is not None:
                totals.cache_hit.add(looked_up)
                totals.success.add(looked_up)
                totals.last_request_unix_s = time.time()
                return Served(hit, cached=True)
            totals.cache_miss.add(looked_up)
        self._admit(now, timeout_s)
        self.stats.requests += 1
        self.arrivals.arrive(now)
        future: asyncio.Future[Outputs] = asyncio.get_running_loop().create_future()
        cold = self.instances == 0
        self._count_start(now, cold)
        if timeout_s is None and self._manifest.requests.timeout_ms > 0:
            timeout_s = self._manifest.requests.timeout_ms / 1000.0
        deadline = now + timeout_s if timeout_s is not None else None
        chosen = self.default_priority if priority is None else priority  # HIGH is 0: falsy
        pending = Pending(inputs, future, now, chosen, deadline, cold)
        if span is not None:
            pending.span, pending.enqueued_ns = span, time.time_ns()
        self._queue.push(pending)
        self._admission.queued += 1
        self._wake.set()
        try:
            if deadline is not None:
                await self._await_or_expire(pending, deadline - now)
            outputs = await future
        except FnrtError as exc:
            self._failed(inputs, exc, now)
            raise
        done = self._clock.now()
        totals.success.add(done - now)
        totals.last_request_unix_s = time.time()
        self.outcomes.record(done, False, done - now)
        self.breaker.record(done, False)
        if cache is not None:
            cache.put(key, outputs)
        if self.last_results is not None:
            self.last_results.put(key or inputs_key(inputs), outputs)
        return Served(outputs, self.stats.last_load_tier if cold else None)

    def _failed(self, inputs: Request, error: FnrtError, started: float) -> None:
        now = self._clock.now()
        self.stats.totals.fail.add(now - started)
        if not isinstance(error, SERVER_FAILURES):
            return
        self.outcomes.record(now, True, now - started)
        self.breaker.record(now, True)
        if self.failures.maxlen:
            self.failures.append(Failure(time.time(), error.to_dict(), inputs))

    async def warm(self) -> None:
        """Load the first instance now if there is none (shares a load under way)."""
        await self._ensure_instance(self._slots[0])

    async def prewarm(self) -> bool:
        """Load ahead of a predicted call; False when it was loaded already."""
        if self.instances or self._closing:
            return False
        await self.warm()
        self._prewarmed_at = self._clock.now()
        return True

    def _count_start(self, now: float, cold: bool) -> None:
        """Whether this call found an instance loaded, loaded by a pre-warm, or none."""
        stats = self.stats
        metrics = self._telemetry.metrics if self._telemetry is not None else None
        if cold:
            kind = "cold"
        elif self._prewarmed_at is not None:
            kind = "prewarmed"
            stats.last_prewarm_lead_s = now - self._prewarmed_at
            self._prewarmed_at = None
            stats.prewarms["hit"] += 1
            if metrics is not None:
                metrics.prewarms.labels(self.name, "hit").inc()
        else:
            kind = "warm"
        stats.starts[kind] += 1
        if metrics is not None:
            metrics.starts.labels(self.name, kind).inc()

    def activity(self) -> Activity:
        """The function as a whole (any instance loaded, any busy)."""
        return Activity(
            loaded=self.instances > 0,
            busy=any(s.running or s.loading is not None for s in self._slots),
            queued=len(self._queue),
            last_active_s=max((s.last_active for s in self._slots), default=0.0),
        )

    async def scale_to_zero(
        self, now: float, *, force: bool = False, keep_primary: bool = False
    ) -> bool:
        """Drop idle instances: extra ones after ``scale_down_after_s``, the last after
        ``keep_alive_s`` (never below ``min_instances``); ``force`` drops every idle
        one now. True if any was dropped."""
        scaling = self._manifest.scaling
        dropped = False
        for slot in sorted(self._slots, key=lambda s: -s.index):
            if slot.instance is None:
                continue
            if not force and self.instances <= scaling.min_instances:
                break
            if slot.primary and keep_primary:
                continue  # the keep-alive policy decides for the first instance
            keep = scaling.keep_alive_s if slot.primary else scaling.scale_down_after_s
            activity = Activity(True, slot.running, len(self._queue), slot.last_active)
            idle = not activity.busy and not activity.queued
            if (force and idle) or should_unload(keep, activity, now):
                await self._drop(slot)
                dropped = True
        return dropped

    async def close(self) -> None:
        """Stop taking requests, finish the queued ones, then unload."""
        self._closing = True
        self._wake.set()
        workers = [s.worker for s in self._slots if s.worker is not None]
        await asyncio.gather(*(asyncio.shield(w) for w in workers), return_exceptions=True)
        for slot in list(self._slots):
            if slot.loading is not None:
                with contextlib.suppress(Exception):
                    await slot.loading
            if slot.instance is not None:
                await self._drop(slot)

    def describe(self) -> dict[str, Any]:
        per_item, fixed = self.cost.coefficients()
        now = self._clock.now()
        last_active = self.activity().last_active_s
        return {
            "version": self.version.version,
            "state": self.state.value,
            "instances": self.instances,
            "queued": len(self._queue),
            "queued_by_priority": self._queue.depth_by_priority(),
            "idle_s": round(max(now - last_active, 0.0), 3),
            "instance_bytes": self.instance_bytes,
            "cost_model": {
                "per_item_ms": round(per_item * 1000, 4),
                "fixed_ms": round(fixed * 1000, 4),
            },
            "arrival_rate_per_s": round(self.arrivals.rate_per_s(now), 3),
            **self.stats.describe(),
            "result_cache": self.result_cache.describe() if self.result_cache else None,
            "breaker": self.breaker.describe(now),
            "failures_kept": len(self.failures),
        }

    # --- admission ---------------------------------------------------------------------

    def _admit(self, now: float, timeout_s: float | None) -> None:
        if self._closing:
            raise VersionRetired(
                f"function '{self.name}' version {self.version.version} is shutting down"
            )
        limit = self._manifest.scaling.max_queue
        if len(self._queue) >= limit:
            self.stats.rejected += 1
            raise Overloaded(
                f"function '{self.name}' has {len(self._queue)} requests queued (its limit)",
                retry_after_s=self._retry_after_s(),
            )
        if self._admission.queued >= self._admission.max_queued:
            self.stats.rejected += 1
            raise Overloaded(
                f"the server has {self._admission.queued} requests queued (its limit)",
                retry_after_s=self._retry_after_s(),
            )
        batching = self._manifest.batching
        if batching.adaptive:
            budget = batching.target_p99_ms / 1000.0
            if timeout_s is not None:
                budget = min(budget, timeout_s)
            expected = predicted_finish_s(
                batching, self.cost, len(self._queue), max(self.instances, 1)
            )
            if expected > budget:
                self.stats.rejected += 1
                raise Unavailable(
                    f"function '{self.name}' cannot answer within {budget * 1000:.0f} ms: "
                    f"about {expected * 1000:.0f} ms of work is queued ahead",
                    expected_ms=round(expected * 1000, 1),
                )

    def _retry_after_s(self) -> float:
        size = self._manifest.batching.max_batch_size
        per_batch = self.cost.predict(size) if self.cost.fitted else 0.1
        rounds = len(self._queue) / size / max(self.instances, 1)
        return float(min(max(math.ceil(rounds * per_batch), 1), 60))

    async def _await_or_expire(self, pending: Pending, timeout_s: float) -> None:
        done = asyncio.Event()
        pending.future.add_done_callback(lambda _: done.set())
        if await self._clock.wait(done, timeout_s) or pending.started:
            return
        self._expire(pending)

    def _expire(self, pending: Pending) -> None:
        if not pending.future.done():
            self.stats.expired += 1
            waited = self._clock.now() - pending.enqueued_at
            pending.future.set_exception(
                DeadlineExceeded(
                    f"function '{self.name}': the deadline passed after "
                    f"{waited * 1000:.0f} ms in the queue"
                )
            )

    # --- instances ---------------------------------------------------------------------

    def _add_slot(self) -> _Slot:
        slot = _Slot(self._next_slot, last_active=self._clock.now())
        self._next_slot += 1
        self._slots.append(slot)
        slot.worker = asyncio.ensure_future(self._work(slot))
        return slot

    async def _ensure_instance(self, slot: _Slot) -> Instance:
        if slot.instance is not None:
            return slot.instance
        if slot.loading is None:
            slot.loading = asyncio.ensure_future(self._load(slot))
        return await asyncio.shield(slot.loading)

    async def _load(self, slot: _Slot) -> Instance:
        started_ns = time.time_ns()
        executor = ThreadPoolExecutor(1, thread_name_prefix=f"fnrt-{self.name}-{slot.index}")
        loop = asyncio.get_running_loop()
        try:
            if self._make_room is not None:
                await self._make_room(self, self.stats.last_load_bytes or self.version.size_bytes)
            instance = await loop.run_in_executor(
                executor, self._load_instance, self.version, executor
            )
        except BaseException as exc:
            executor.shutdown(wait=False)
            self.stats.load_failures += 1
            if isinstance(exc, FnrtError):
                self.stats.last_load_error = exc.message
                raise
            error_id = new_error_id()
            log.error(
                "loading %s %s failed (error id %s)",
                self.name,
                self.version.version,
                error_id,
                exc_info=exc,
            )
            error = LoadError(self.name, error_id, f"{type(exc).__name__}: {exc}")
            self.stats.last_load_error = error.message
            raise error from exc
        finally:
            slot.loading = None
        slot.instance = instance
        self.stats.last_load_error = None
        # A full collection walks every object torch and the model made (~100 ms
        # with torch loaded): freeze them out of the collector so per-request
        # garbage never triggers such a pause (the p99 of a busy function).
        gc.freeze()
        slot.last_active = self._clock.now()
        stats = self.stats
        stats.loads += 1
        stats.last_load_timings_s = dict(instance.timings_s)
        stats.last_load_tier = instance.tier
        stats.last_load_bytes = instance.size_bytes
        stats.cold_starts[instance.tier] += 1
        if self._telemetry is not None:
            total_s = instance.timings_s["total_s"]
            self._telemetry.metrics.load(self.name, instance.tier, instance.size_bytes, total_s)
            self._load_span = (
                started_ns,
                time.time_ns(),
                {
                    "fnrt.load.tier": instance.tier,
                    "fnrt.load.bytes": instance.size_bytes,
                    **{f"fnrt.load.{k}": v for k, v in instance.timings_s.items()},
                },
            )
        log.info(
            "loaded %s %s (instance %d, %s) in %.3fs",
            self.name,
            self.version.version,
            slot.index,
            instance.tier,
            instance.timings_s["total_s"],
        )
        return instance

    async def _drop(self, slot: _Slot) -> None:
        instance, slot.instance = slot.instance, None
        if instance is None:
            return
        self.stats.unloads += 1
        if self._prewarmed_at is not None and slot.primary:  # loaded ahead, never used
            self._prewarmed_at = None
            self.stats.prewarms["miss"] += 1
            if self._telemetry is not None:
                self._telemetry.metrics.prewarms.labels(self.name, "miss").inc()
        if not slot.primary:
            slot.retired = True
            self._slots.remove(slot)
            self._wake.set()
        log.info("unloaded %s %s (instance %d)", self.name, self.version.version, slot.index)
        await asyncio.to_thread(_release, instance)

    def _maybe_scale_up(self, now: float) -> None:
        scaling = self._manifest.scaling
        size = self._manifest.batching.max_batch_size
        if len(self._queue) >= size:
            self._deep_since = self._deep_since if self._deep_since is not None else now
        else:
            self._deep_since = None
        if should_add_instance(
            scaling,
            instances=len(self._slots),
            loading=any(s.loading is not None for s in self._slots),
            queued=len(self._queue),
            batch_size=size,
            deep_since_s=self._deep_since,
            now=now,
        ):
            slot = self._add_slot()
            log.info("scaling %s up to %d instances", self.name, len(self._slots))
            slot.loading = asyncio.ensure_future(self._load(slot))
            slot.loading.add_done_callback(_quiet)

    # --- batches -----------------------------------------------------------------------

    def _plan(self, now: float) -> Plan:
        """The batching decision for the queue as it is now (fixed or adaptive)."""
        batching = self._manifest.batching
        oldest = self._queue.oldest_enqueued_at()
        waited = now - oldest if oldest is not None else 0.0
        if batching.adaptive:
            return adaptive_plan(
                batching, self.cost, self.arrivals.rate_per_s(now), len(self._queue), waited
            )
        return Plan(
            batching.max_batch_size, flush_delay_s(batching, len(self._queue), waited) or 0.0
        )

    def _fail_queued(self, error: BaseException) -> None:
        for pending in self._queue.drain():
            self._admission.queued -= 1
            if not pending.future.done():
                self.stats.errors += 1
                pending.future.set_exception(error)

    async def _work(self, slot: _Slot) -> None:
        while not slot.retired:
            now = self._clock.now()
            self._maybe_scale_up(now)
            if not self._queue:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                instance = await self._ensure_instance(slot)
            except FnrtError as exc:
                if slot.primary:
                    if self.instances == 0:  # nobody else can serve them
                        self._fail_queued(exc)
                    else:  # the other instances serve; try again at the next arrival
                        self._wake.clear()
                        await self._wake.wait()
                    continue
                slot.retired = True
                self._slots.remove(slot)
                return
            plan = self._plan(self._clock.now())
            if plan.wait_s > 1e-6:  # below a microsecond a timer is not worth it
                self._wake.clear()
                await self._clock.wait(self._wake, plan.wait_s)
                continue
            taken = self._queue.take(plan.size, self._clock.now())
            self._admission.queued -= taken.removed
            for pending in taken.expired:
                self._expire(pending)
            if taken.batch:
                await self._run_batch(slot, instance, taken.batch)

    async def _run_batch(self, slot: _Slot, instance: Instance, batch: list[Pending]) -> None:
        slot.running = True
        started = self._clock.now()
        started_ns = time.time_ns()
        failure: BaseException | None = None
        totals = self.stats.totals
        for p in batch:
            self.stats.queue_wait.add(started - p.enqueued_at)
            totals.queue.add(started - p.enqueued_at)
        loop = asyncio.get_running_loop()
        ran: Ran | None = None
        try:
            ran = await loop.run_in_executor(
                instance.executor, instance.run_timed, [p.inputs for p in batch]
            )
        except Exception as exc:
            error_id = new_error_id()
            log.error(
                "function %s %s failed on a batch of %d (error id %s)",
                self.name,
                self.version.version,
                len(batch),
                error_id,
                exc_info=exc,
            )
            self.stats.errors += len(batch)
            failure = exc
            error = HandlerFailed(self.name, error_id, f"{type(exc).__name__}: {exc}")
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(error)
        else:
            for p, result in zip(batch, ran.results, strict=True):
                if not p.future.done():
                    p.future.set_result(result)
        finally:
            slot.running = False
            slot.last_active = self._clock.now()
            elapsed = slot.last_active - started
            self.cost.observe(len(batch), elapsed)
            self.stats.compute.add(elapsed)
            self.stats.batches += 1
            self.stats.batch_sizes[len(batch)] += 1
            if ran is not None:  # handing inputs over: the rest of the batch's time
                handed_s = max(elapsed - ran.infer_s - ran.output_s, 0.0)
                totals.batch(len(batch), handed_s, ran.infer_s, ran.output_s)
            if self._telemetry is not None:
                self._report(self._telemetry, batch, started, started_ns, elapsed, failure)

    def _report(
        self,
        telemetry: Telemetry,
        batch: list[Pending],
        started: float,
        started_ns: int,
        elapsed_s: float,
        failure: BaseException | None,
    ) -> None:
        """One batch's metrics and (tracing on) spans: queue waits, the load, the batch."""
        metrics = telemetry.metrics
        metrics.batch(self.name, len(batch), elapsed_s, (started - p.enqueued_at for p in batch))
        metrics.warm_hits(sum(1 for p in batch if not p.cold))
        tracing = telemetry.tracing
        if not tracing.enabled:
            return
        version = self.version.version
        span = tracing.batch_span(self.name, version, (p.span for p in batch), started_ns)
        for p in batch:
            if p.span is None:
                continue
            tracing.child(
                p.span,
                "queue",
                {"fnrt.priority": p.priority.name.lower()},
                start_ns=p.enqueued_ns,
                end_ns=started_ns,
            )
            if p.cold and self._load_span is not None:
                load_start, load_end, attributes = self._load_span
                tracing.child(p.span, "load", attributes, start_ns=load_start, end_ns=load_end)
        if span is not None:
            if failure is not None:
                fail(span, failure)
            span.end()


def _quiet(future: asyncio.Future[Instance]) -> None:
    """Retrieve a background load's error (it is logged where it happened)."""
    if not future.cancelled():
        future.exception()


def _release(instance: Instance) -> None:
    """Close an instance and collect what it held (runs off the event loop).

    The instance's objects were frozen after its load; unfreeze so the one full
    collection here can free any reference cycles among them, then freeze again.
    """
    instance.close()
    del instance
    gc.unfreeze()
    gc.collect()
    gc.freeze()
