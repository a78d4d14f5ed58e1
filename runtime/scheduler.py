"""One scheduler per deployed function version: admission, batching, instance lifecycle.

Requests are admitted into a bounded queue (a full queue answers Overloaded,
which the HTTP layer turns into 429 with ``Retry-After``). A single worker
task takes batches off the queue as :func:`fnrt.runtime.batching.flush_delay_s`
decides, makes sure an instance is loaded (concurrent first requests share one
load), and runs the handler on the instance's own thread so the event loop
never runs model code. :meth:`Scheduler.scale_to_zero` drops an idle instance
when :func:`fnrt.runtime.scaling.should_unload` says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from fnrt.functions.errors import (
    FnrtError,
    HandlerError,
    HandlerFailed,
    LoadError,
    Overloaded,
    Unavailable,
)
from fnrt.functions.handler import Request
from fnrt.functions.version import VersionManifest
from fnrt.loader.instance import Instance, InstanceLoader
from fnrt.runtime.batching import flush_delay_s
from fnrt.runtime.clock import Clock
from fnrt.runtime.scaling import Activity, should_unload

log = logging.getLogger("fnrt.scheduler")

Outputs = dict[str, np.ndarray[Any, Any]]


class InstanceState(Enum):
    COLD = "cold"
    LOADING = "loading"
    WARM = "warm"


def new_error_id() -> str:
    return uuid.uuid4().hex[:16]


@dataclass(frozen=True)
class Served:
    """A request's outputs, and the tier its instance was loaded from if it waited for a load."""

    outputs: Outputs
    cold_tier: str | None = None


@dataclass
class _Pending:
    inputs: Request
    future: asyncio.Future[Outputs]
    enqueued_at: float
    cold: bool  # no instance was loaded when it arrived


#: Called before a load with (the scheduler, bytes it expects to need); frees memory.
MakeRoom = Callable[["Scheduler", int], Awaitable[None]]


@dataclass
class Stats:
    """Counters shown by ``GET /v1/functions/{name}``."""

    requests: int = 0
    errors: int = 0
    rejected: int = 0
    batches: int = 0
    loads: int = 0
    load_failures: int = 0
    unloads: int = 0
    last_load_timings_s: dict[str, float] = field(default_factory=dict)
    last_load_tier: str | None = None
    last_load_bytes: int = 0
    cold_starts: dict[str, int] = field(default_factory=dict)  # by tier
    batch_s_ewma: float = 0.0

    def observe_batch(self, seconds: float) -> None:
        self.batch_s_ewma = seconds if not self.batches else 0.8 * self.batch_s_ewma + 0.2 * seconds
        self.batches += 1


class Scheduler:
    """Queue, batcher and instance of one function version."""

    def __init__(
        self,
        version: VersionManifest,
        loader: InstanceLoader,
        clock: Clock,
        make_room: MakeRoom | None = None,
    ) -> None:
        self.version = version
        self._make_room = make_room
        self._manifest = version.manifest
        self._loader = loader
        self._clock = clock
        self._queue: deque[_Pending] = deque()
        self._wake = asyncio.Event()
        self._instance: Instance | None = None
        self._loading: asyncio.Future[Instance] | None = None
        self._running = False
        self._closing = False
        self._last_active = clock.now()
        self.stats = Stats()
        self._worker = asyncio.ensure_future(self._work())

    # --- public --------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._manifest.name

    @property
    def state(self) -> InstanceState:
        if self._instance is not None:
            return InstanceState.WARM
        return InstanceState.LOADING if self._loading is not None else InstanceState.COLD

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def instance_bytes(self) -> int:
        """Memory the loaded instance holds (0 when cold)."""
        return self._instance.size_bytes if self._instance is not None else 0

    async def submit(self, inputs: Request) -> Served:
        """Queue one request and wait for its outputs."""
        if self._closing:
            raise Unavailable(
                f"function '{self.name}' version {self.version.version} is shutting down"
            )
        if len(self._queue) >= self._manifest.scaling.max_queue:
            self.stats.rejected += 1
            raise Overloaded(
                f"function '{self.name}' has {len(self._queue)} requests queued (the limit)",
                retry_after_s=self._retry_after_s(),
            )
        self.stats.requests += 1
        future: asyncio.Future[Outputs] = asyncio.get_running_loop().create_future()
        cold = self._instance is None
        self._queue.append(_Pending(inputs, future, self._clock.now(), cold))
        self._wake.set()
        outputs = await future
        return Served(outputs, self.stats.last_load_tier if cold else None)

    async def warm(self) -> None:
        """Load an instance now if there is none (shares a load already under way)."""
        await self._ensure_instance()

    def activity(self) -> Activity:
        return Activity(
            loaded=self._instance is not None,
            busy=self._running or self._loading is not None,
            queued=len(self._queue),
            last_active_s=self._last_active,
        )

    async def scale_to_zero(self, now: float, *, force: bool = False) -> bool:
        """Unload the instance if it has been idle for keep-alive (or ``force``); True if so."""
        activity = self.activity()
        if force:
            if not activity.loaded or activity.busy or activity.queued:
                return False
        elif not should_unload(self._manifest.scaling.keep_alive_s, activity, now):
            return False
        instance, self._instance = self._instance, None
        assert instance is not None
        self.stats.unloads += 1
        log.info("scaled %s %s to zero", self.name, self.version.version)
        await asyncio.to_thread(_release, instance)
        return True

    async def close(self) -> None:
        """Stop taking requests, finish the queued ones, then unload."""
        self._closing = True
        self._wake.set()
        await asyncio.shield(self._worker)
        if self._loading is not None:
            with contextlib.suppress(Exception):
                await self._loading
        if self._instance is not None:
            instance, self._instance = self._instance, None
            await asyncio.to_thread(_release, instance)

    def describe(self) -> dict[str, Any]:
        s = self.stats
        return {
            "version": self.version.version,
            "state": self.state.value,
            "queued": len(self._queue),
            "idle_s": round(max(self._clock.now() - self._last_active, 0.0), 3),
            "requests": s.requests,
            "errors": s.errors,
            "rejected": s.rejected,
            "batches": s.batches,
            "loads": s.loads,
            "load_failures": s.load_failures,
            "unloads": s.unloads,
            "instance_bytes": self.instance_bytes,
            "last_load_tier": s.last_load_tier,
            "last_load_timings_s": {k: round(v, 6) for k, v in s.last_load_timings_s.items()},
            "cold_starts": dict(s.cold_starts),
        }

    # --- internals -----------------------------------------------------------

    def _retry_after_s(self) -> float:
        per_batch = self.stats.batch_s_ewma or 0.1
        batches_ahead = len(self._queue) / self._manifest.batching.max_batch_size
        return float(min(max(math.ceil(batches_ahead * per_batch), 1), 60))

    async def _ensure_instance(self) -> Instance:
        if self._instance is not None:
            return self._instance
        if self._loading is None:
            self._loading = asyncio.ensure_future(self._load())
        return await asyncio.shield(self._loading)

    async def _load(self) -> Instance:
        executor = ThreadPoolExecutor(1, thread_name_prefix=f"fnrt-{self.name}")
        loop = asyncio.get_running_loop()
        try:
            if self._make_room is not None:
                await self._make_room(self, self.stats.last_load_bytes or self.version.size_bytes)
            instance = await loop.run_in_executor(
                executor, self._loader.load, self.version, executor
            )
        except BaseException as exc:
            executor.shutdown(wait=False)
            self.stats.load_failures += 1
            if isinstance(exc, HandlerError | FnrtError):
                raise
            error_id = new_error_id()
            log.error(
                "loading %s %s failed (error id %s)",
                self.name,
                self.version.version,
                error_id,
                exc_info=exc,
            )
            raise LoadError(self.name, error_id, f"{type(exc).__name__}: {exc}") from exc
        finally:
            self._loading = None
        self._instance = instance
        # A full collection walks every object torch and the model made (~100 ms
        # with torch loaded): freeze them out of the collector so per-request
        # garbage never triggers such a pause (the p99 of a busy function).
        gc.freeze()
        self._last_active = self._clock.now()
        self.stats.loads += 1
        self.stats.last_load_timings_s = dict(instance.timings_s)
        self.stats.last_load_tier = instance.tier
        self.stats.last_load_bytes = instance.size_bytes
        self.stats.cold_starts[instance.tier] = self.stats.cold_starts.get(instance.tier, 0) + 1
        log.info(
            "loaded %s %s in %.3fs", self.name, self.version.version, instance.timings_s["total_s"]
        )
        return instance

    def _fail_queued(self, error: BaseException) -> None:
        while self._queue:
            pending = self._queue.popleft()
            if not pending.future.done():
                self.stats.errors += 1
                pending.future.set_exception(error)

    async def _work(self) -> None:
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                instance = await self._ensure_instance()
            except FnrtError as exc:
                self._fail_queued(exc)
                continue
            delay = flush_delay_s(
                self._manifest.batching,
                len(self._queue),
                self._clock.now() - self._queue[0].enqueued_at,
            )
            if delay:
                self._wake.clear()
                await self._clock.wait(self._wake, delay)
                continue
            await self._run_batch(instance)

    async def _run_batch(self, instance: Instance) -> None:
        size = min(len(self._queue), self._manifest.batching.max_batch_size)
        batch = [self._queue.popleft() for _ in range(size)]
        batch = [p for p in batch if not p.future.done()]  # the client went away
        if not batch:
            return
        self._running = True
        started = self._clock.now()
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(
                instance.executor, instance.run, [p.inputs for p in batch]
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
            error = HandlerFailed(self.name, error_id, f"{type(exc).__name__}: {exc}")
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(error)
        else:
            for p, result in zip(batch, results, strict=True):
                if not p.future.done():
                    p.future.set_result(result)
        finally:
            self._running = False
            self._last_active = self._clock.now()
            self.stats.observe_batch(self._last_active - started)


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
