"""What the batch and generative queues of a version share: admission, deadlines,
scale-up, and the settling of calls that leave without running.

:class:`Intake` is the base of :class:`~fnrt.runtime.batcher.Batcher` (batches of
requests) and :class:`~fnrt.runtime.sequencer.Sequencer` (steps of sequences).
A call (:class:`~fnrt.runtime.queue.Call`) is admitted once (VersionRetired,
Overloaded: :class:`Admission`'s bounds per version and per node) and pushed;
deadlines are watched by one timer per queue, armed at the earliest deadline
queued, never one per request; a take drops what has expired or whose client
left. The queue's loops (one per slot of the pool) are the subclasses'.
Outcomes are settled where they happen, per batch: latency totals, and for
calls that passed the gateway (``counted``) the breaker and canary window.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Coroutine
from typing import Any

from fnrt.functions.errors import (
    ClientLeft,
    DeadlineExceeded,
    FnrtError,
    Overloaded,
    Unavailable,
    VersionRetired,
)
from fnrt.functions.handler import Request
from fnrt.functions.version import VersionManifest
from fnrt.runtime.batching import CostModel, RateEstimator
from fnrt.runtime.clock import Clock
from fnrt.runtime.events import Events
from fnrt.runtime.pool import InstancePool, Slot
from fnrt.runtime.protection import Protection
from fnrt.runtime.queue import Call, Client, Priority, RequestQueue
from fnrt.runtime.stats import Stats

log = logging.getLogger("fnrt.intake")


class Admission:
    """The node-wide bound on queued requests, shared by every version's queue."""

    def __init__(self, max_queued: int) -> None:
        self.max_queued = max_queued
        self.queued = 0

    def check(self, intake: Intake) -> None:
        """Raise unless one more request may join ``intake``'s queue: VersionRetired (it
        is closing), Overloaded (its bound, or the node's)."""
        version = intake.version
        if intake.closing:
            raise VersionRetired(
                f"function '{version.name}' version {version.version} is shutting down"
            )
        queued = len(intake._queue)
        if queued >= version.manifest.scaling.max_queue:
            intake._stats.rejected += 1
            raise Overloaded(
                f"function '{version.name}' has {queued} requests queued (its limit)",
                retry_after_s=intake.retry_after_s(),
            )
        if self.queued >= self.max_queued:
            intake._stats.rejected += 1
            raise Overloaded(
                f"the server has {self.queued} requests queued (its limit)",
                retry_after_s=intake.retry_after_s(),
            )


class Intake:
    """The queue of one version, its admission and deadlines; the loops are a subclass's."""

    #: rows a deep queue must hold before the pool is asked for one more instance
    #: (None: the version's ``max_batch_size``)
    deep_rows: int | None = None

    def __init__(
        self,
        version: VersionManifest,
        pool: InstancePool,
        clock: Clock,
        stats: Stats,
        events: Events,
        admission: Admission | None = None,
        protection: Protection | None = None,
    ) -> None:
        self.version = version
        self._manifest = version.manifest
        self._pool = pool
        self._clock = clock
        self._stats = stats
        self._events = events
        self._admission = admission or Admission(1 << 62)
        self._protection = protection  # outcomes of counted calls go to it
        requests = self._manifest.requests
        self.default_priority = Priority.parse(requests.default_priority)
        self.default_timeout_s = requests.timeout_ms / 1000.0 if requests.timeout_ms > 0 else None
        self._queue = RequestQueue(requests.aging_ms / 1000.0)
        self._wake = asyncio.Event()
        self.closing = False
        self.cost = CostModel()
        self.arrivals = RateEstimator()
        self._deadline_at: float | None = None  # when the deadline timer fires
        self._deadline_timer: asyncio.Future[None] | None = None
        self._loops: set[asyncio.Task[None]] = set()  # one per slot it serves
        pool.changed = self._wake.set
        self._serve(pool.slots[0])

    @property
    def name(self) -> str:
        return self._manifest.name

    @property
    def queued(self) -> int:
        return len(self._queue)

    def depth_by_priority(self) -> dict[str, int]:
        return self._queue.depth_by_priority()

    # --- calls in -----------------------------------------------------------------------

    def call(
        self,
        inputs: Request,
        now: float,
        priority: Priority | None = None,
        timeout_s: float | None = None,
        *,
        span: Any = None,
        client: Client | None = None,
        counted: bool = False,
        scheduler: Any = None,
        split: int | None = None,
        asked: Any = None,
        alone: bool = False,
    ) -> Call:
        """The record of one request to this version, arrived at ``now``: the version's
        default priority and timeout where it asks for none (``math.inf``: no deadline,
        a job's record)."""
        if timeout_s is None:
            timeout_s = self.default_timeout_s
        elif timeout_s == math.inf:
            timeout_s = None
        return Call(
            inputs,
            asyncio.get_running_loop().create_future(),
            now,
            self.default_priority if priority is None else priority,  # HIGH is 0: falsy
            None if timeout_s is None else now + timeout_s,
            span=span,
            enqueued_ns=0 if span is None else time.time_ns(),
            client=client,
            alone=alone,
            scheduler=scheduler,
            counted=counted,
            split=split,
            asked=asked,
        )

    def _push(self, call: Call) -> None:
        """Queue an admitted call; the deadline timer is armed if it is the earliest."""
        self._stats.requests += call.rows
        self.arrivals.arrive(call.enqueued_at)
        self._queue.push(call)
        self._admission.queued += 1
        self._wake.set()
        deadline = call.deadline
        if deadline is not None and (self._deadline_at is None or deadline < self._deadline_at):
            self._arm(deadline)

    def retry_after_s(self) -> float:
        """When a refused client may try again (Retry-After), from the queue's work."""
        size = self._manifest.batching.max_batch_size
        per_batch = self.cost.predict(size) if self.cost.fitted else 0.1
        rounds = len(self._queue) / size / max(self._pool.instances, 1)
        return float(min(max(math.ceil(rounds * per_batch), 1), 60))

    # --- deadlines: one timer per queue ---------------------------------------------------

    def _arm(self, at: float) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        self._deadline_at = at
        self._deadline_timer = asyncio.ensure_future(self._expire_due(at))

    async def _expire_due(self, at: float) -> None:
        await self._clock.sleep(max(at - self._clock.now(), 0.0))
        now = self._clock.now()
        due, ahead = self._queue.due(now)
        for call in due:
            self._expire(call, now)
        self._deadline_timer = self._deadline_at = None
        if ahead is not None:
            self._arm(ahead)

    # --- calls out ----------------------------------------------------------------------

    def _expire(self, call: Call, now: float) -> None:
        """Answer a call whose deadline passed before it ran (504)."""
        self._stats.expired += 1
        waited = now - call.enqueued_at
        self._settle_failed(
            [call],
            DeadlineExceeded(
                f"function '{self.name}': the deadline passed after "
                f"{waited * 1000:.0f} ms in the queue"
            ),
            now,
            errors=False,
        )

    def _abandon(self, call: Call) -> None:
        """Answer a call whose client left while it waited (499 in the log)."""
        self._stats.abandoned += 1
        self._settle_failed(
            [call],
            ClientLeft(f"function '{self.name}': the client left while its request was queued"),
            self._clock.now(),
            errors=False,
        )

    def _settle_failed(
        self, calls: list[Call], error: BaseException, now: float, *, errors: bool = True
    ) -> None:
        """Answer ``calls`` with ``error``: totals, and the breaker for counted ones."""
        totals = self._stats.totals
        protection = self._protection
        for call in calls:
            if self._answer_error(call, error):
                if errors:
                    self._stats.errors += call.rows
                latency = now - call.enqueued_at
                totals.fail.add(latency)
                if call.counted and protection is not None and isinstance(error, FnrtError):
                    protection.failed(now, latency, error, call.inputs)

    def _answer_error(self, call: Call, error: BaseException) -> bool:
        """Give ``call`` its error; False if it had its answer already."""
        if call.future.done():
            return False
        call.future.set_exception(error)
        return True

    def fail_queued(self, error: BaseException) -> None:
        """Answer every queued call with ``error`` now (a load that failed with nobody
        to serve them, a shutdown cutting them off)."""
        drained = self._queue.drain()
        self._admission.queued -= len(drained)
        self._settle_failed(drained, error, self._clock.now())

    def _take(self, size: int, now: float) -> Any:
        """Up to ``size`` rows off the queue; the expired and abandoned are answered."""
        taken = self._queue.take(size, now)
        self._admission.queued -= taken.removed
        for call in taken.expired:
            self._expire(call, now)
        for call in taken.abandoned:
            self._abandon(call)
        return taken

    # --- the loops ----------------------------------------------------------------------

    def _serve(self, slot: Slot) -> None:
        """Start the loop of a new slot (a subclass's: :meth:`_start` it)."""
        raise NotImplementedError

    def _start(self, loop: Coroutine[Any, Any, None]) -> None:
        """Run a slot's loop, held until it ends (:meth:`close` waits for it). A loop that
        ends wakes the others: one waiting for an instance of its own while this one
        served looks again (and fails the queue if no instance is left)."""
        task = asyncio.ensure_future(loop)
        self._loops.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Future[None]) -> None:
        self._loops.discard(task)
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def _maybe_scale_up(self, now: float) -> None:
        slot = self._pool.scale_up(len(self._queue), now, self.deep_rows)  # the pool's slots
        if slot is not None:
            self._serve(slot)

    async def close(self) -> None:
        """Stop taking calls; return when the queued (and running) ones are answered (503
        for any still queued once every loop has ended: no instance was left to run them)."""
        self.closing = True
        self._wake.set()
        while self._loops:
            loops = list(self._loops)
            await asyncio.gather(*(asyncio.shield(w) for w in loops), return_exceptions=True)
        if self._queue:
            self.fail_queued(Unavailable(f"function '{self.name}': closed before it ran; retry"))
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
