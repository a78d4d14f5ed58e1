"""The queue of one function version and the loop that turns it into batches.

Requests are admitted into a bounded :class:`~fnrt.runtime.queue.RequestQueue`
(per version and, through :class:`Admission`, per node; beyond either,
Overloaded -> 429 with ``Retry-After``). Each slot of the
:class:`~fnrt.runtime.pool.InstancePool` has a worker task here that takes
batches off the shared queue as the pure batching decision says (fixed or
adaptive, :mod:`fnrt.runtime.batching`), runs them on its instance and
answers each request. The loop also asks the pool to scale up while the
queue stays deep.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
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
from fnrt.loader.instance import Ran, Runnable
from fnrt.loader.staging import Staged
from fnrt.runtime.batching import (
    CostModel,
    Plan,
    RateEstimator,
    adaptive_plan,
    flush_delay_s,
    job_pause_s,
    predicted_finish_s,
)
from fnrt.runtime.clock import Clock
from fnrt.runtime.events import Events
from fnrt.runtime.pool import InstancePool, Slot, run_failure
from fnrt.runtime.protection import Served
from fnrt.runtime.queue import Client, Outputs, Pending, Priority, RequestQueue, Taken
from fnrt.runtime.stats import Stats

log = logging.getLogger("fnrt.batcher")


class Admission:
    """The node-wide bound on queued requests, shared by every version's batcher."""

    def __init__(self, max_queued: int) -> None:
        self.max_queued = max_queued
        self.queued = 0

    def check(
        self,
        version: VersionManifest,
        closing: bool,
        queued: int,
        stats: Stats,
        retry_after_s: Callable[[], float],
    ) -> None:
        """Raise unless one more request may join a version's queue of ``queued``:
        VersionRetired (it is closing), Overloaded (its bound, or the node's)."""
        name = version.name
        if closing:
            raise VersionRetired(f"function '{name}' version {version.version} is shutting down")
        if queued >= version.manifest.scaling.max_queue:
            stats.rejected += 1
            raise Overloaded(
                f"function '{name}' has {queued} requests queued (its limit)",
                retry_after_s=retry_after_s(),
            )
        if self.queued >= self.max_queued:
            stats.rejected += 1
            raise Overloaded(
                f"the server has {self.queued} requests queued (its limit)",
                retry_after_s=retry_after_s(),
            )


class Batcher:
    """Queue and batch loop of one function version."""

    def __init__(
        self,
        version: VersionManifest,
        pool: InstancePool,
        clock: Clock,
        stats: Stats,
        events: Events,
        admission: Admission | None = None,
    ) -> None:
        self.version = version
        self._manifest = version.manifest
        self._pool = pool
        self._clock = clock
        self._stats = stats
        self._events = events
        self._admission = admission or Admission(1 << 62)
        requests = self._manifest.requests
        self.default_priority = Priority.parse(requests.default_priority)
        self._queue = RequestQueue(requests.aging_ms / 1000.0)
        self._wake = asyncio.Event()
        self.closing = False
        self.cost = CostModel()
        self.arrivals = RateEstimator()
        pool.changed = self._wake.set
        self._serve(pool.add_slot())

    @property
    def name(self) -> str:
        return self._manifest.name

    @property
    def queued(self) -> int:
        return len(self._queue)

    def depth_by_priority(self) -> dict[str, int]:
        return self._queue.depth_by_priority()

    # --- admission ---------------------------------------------------------------------

    async def enqueue(
        self,
        inputs: Request,
        now: float,
        *,
        priority: Priority | None = None,
        timeout_s: float | None = None,
        span: Any = None,
        cold: bool = False,
        client: Client | None = None,
        alone: bool = False,
    ) -> Served:
        """Queue one request admitted at ``now`` (:meth:`admit`) and wait for its outputs.

        Raises DeadlineExceeded (``timeout_s`` passed before it was computed) or
        the batch's HandlerFailed.
        """
        self._stats.requests += 1
        self.arrivals.arrive(now)
        future: asyncio.Future[Outputs] = asyncio.get_running_loop().create_future()
        if timeout_s is None and self._manifest.requests.timeout_ms > 0:
            timeout_s = self._manifest.requests.timeout_ms / 1000.0
        deadline = now + timeout_s if timeout_s is not None else None
        chosen = self.default_priority if priority is None else priority  # HIGH is 0: falsy
        pending = Pending(inputs, future, now, chosen, deadline, cold)
        pending.client = client
        if alone:
            pending.alone = True
        if span is not None:
            pending.span, pending.enqueued_ns = span, time.time_ns()
        self._queue.push(pending)
        self._admission.queued += 1
        self._wake.set()
        totals = self._stats.totals
        try:
            if deadline is not None:
                await self._await_or_expire(pending, deadline - now)
            outputs = await future
        except FnrtError:
            totals.fail.add(self._clock.now() - now)
            raise
        totals.success.add(self._clock.now() - now)
        totals.last_request_unix_s = time.time()
        return Served(outputs, self._stats.last_load_tier if cold else None)

    async def enqueue_block(
        self, records: list[Request], now: float, *, cold: bool = False
    ) -> list[Outputs]:
        """Queue a block of job records (at most a batch of them), admitted at ``now``,
        at job priority: they join one batch together, each a request of the handler's
        own; the outputs of each, in order. One future and one queue entry for the
        block: a job's records cost the event loop next to nothing each."""
        self._stats.requests += len(records)
        future: asyncio.Future[list[Outputs]] = asyncio.get_running_loop().create_future()
        pending = Pending({}, future, now, Priority.JOB, None, cold)  # type: ignore[arg-type]
        pending.block, pending.rows = records, len(records)
        self._queue.push(pending)
        self._admission.queued += 1
        self._wake.set()
        totals = self._stats.totals
        try:
            outputs = await future
        except FnrtError:
            totals.fail.add(self._clock.now() - now)
            raise
        totals.success.add(self._clock.now() - now)
        totals.last_request_unix_s = time.time()
        return outputs

    def admit_block(self) -> None:
        """Raise unless a block of job records may join the queue: VersionRetired or
        Overloaded, as for a request. No latency target applies to a job's records:
        adaptive batching's refusal is for live requests."""
        self._admission.check(
            self.version, self.closing, len(self._queue), self._stats, self._retry_after_s
        )

    def admit(self, now: float, timeout_s: float | None) -> None:
        """Raise unless a request may join the queue now: VersionRetired (closing),
        Overloaded (a queue bound), Unavailable (adaptive batching: it cannot
        finish within the target)."""
        self._admission.check(
            self.version, self.closing, len(self._queue), self._stats, self._retry_after_s
        )
        batching = self._manifest.batching
        if batching.adaptive:
            budget = batching.target_p99_ms / 1000.0
            if timeout_s is not None:
                budget = min(budget, timeout_s)
            expected = predicted_finish_s(
                batching, self.cost, len(self._queue), max(self._pool.instances, 1)
            )
            if expected > budget:
                self._stats.rejected += 1
                raise Unavailable(
                    f"function '{self.name}' cannot answer within {budget * 1000:.0f} ms: "
                    f"about {expected * 1000:.0f} ms of work is queued ahead",
                    expected_ms=round(expected * 1000, 1),
                )

    def _retry_after_s(self) -> float:
        size = self._manifest.batching.max_batch_size
        per_batch = self.cost.predict(size) if self.cost.fitted else 0.1
        rounds = len(self._queue) / size / max(self._pool.instances, 1)
        return float(min(max(math.ceil(rounds * per_batch), 1), 60))

    async def _await_or_expire(self, pending: Pending, timeout_s: float) -> None:
        done = asyncio.Event()
        pending.future.add_done_callback(lambda _: done.set())
        if await self._clock.wait(done, timeout_s) or pending.started:
            return
        self._expire(pending)

    def _expire(self, pending: Pending) -> None:
        if not pending.future.done():
            self._stats.expired += 1
            waited = self._clock.now() - pending.enqueued_at
            pending.future.set_exception(
                DeadlineExceeded(
                    f"function '{self.name}': the deadline passed after "
                    f"{waited * 1000:.0f} ms in the queue"
                )
            )

    def _abandon(self, pending: Pending) -> None:
        if not pending.future.done():
            self._stats.abandoned += 1
            pending.future.set_exception(
                ClientLeft(f"function '{self.name}': the client left while its request was queued")
            )

    # --- the loop ----------------------------------------------------------------------

    def _serve(self, slot: Slot) -> None:
        slot.worker = asyncio.ensure_future(self._work(slot))

    def wake(self) -> None:
        self._wake.set()

    async def close(self) -> None:
        """Stop taking requests; return when the queued ones are answered."""
        self.closing = True
        self._wake.set()
        workers = [s.worker for s in self._pool.slots if s.worker is not None]
        await asyncio.gather(*(asyncio.shield(w) for w in workers), return_exceptions=True)

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

    def fail_queued(self, error: BaseException) -> None:
        """Answer every queued request with ``error`` now (a shutdown cutting them off)."""
        self._fail_queued(error)

    def _fail_queued(self, error: BaseException) -> None:
        for pending in self._queue.drain():
            self._admission.queued -= 1
            if not pending.future.done():
                self._stats.errors += 1
                pending.future.set_exception(error)

    def _maybe_scale_up(self, now: float) -> None:
        if self._pool.wants_another(len(self._queue), now):
            slot = self._pool.add_slot()
            log.info("scaling %s up to %d instances", self.name, len(self._pool.slots))
            self._pool.load_in_background(slot)
            self._serve(slot)

    async def _work(self, slot: Slot) -> None:
        pool = self._pool
        ahead: tuple[Taken, Staged] | None = None  # the next batch, staged while one ran
        while ahead is not None or not slot.retired:
            self._maybe_scale_up(self._clock.now())
            if ahead is None and not self._queue:
                if self.closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                instance = await pool.ensure(slot)
            except FnrtError as exc:
                if ahead is not None:  # staged on an instance that was lost; none comes
                    ahead[1].release()
                    self._fail(ahead[0].batch, ahead[0].rows, exc)
                    ahead = None
                if slot.primary:
                    if pool.instances == 0:  # nobody else can serve them
                        self._fail_queued(exc)
                    else:  # the other instances serve; try again at the next arrival
                        self._wake.clear()
                        await self._wake.wait()
                    continue
                pool.retire(slot)
                return
            staged: Staged | None = None
            if ahead is not None:
                (taken, staged), ahead = ahead, None
                if staged.stager is not instance.stager:  # its instance was lost meanwhile
                    staged.release()
                    staged = None
            else:
                plan = self._plan(self._clock.now())
                if plan.wait_s > 1e-6:  # below a microsecond a timer is not worth it
                    self._wake.clear()
                    await self._clock.wait(self._wake, plan.wait_s)
                    continue
                taken = self._take(plan.size, self._clock.now())
            if not taken.batch:
                continue
            started = self._clock.now()
            if instance.stager is None:
                await self._run_batch(slot, instance, taken.batch, taken.rows, taken.blocks)
            else:
                ahead = await self._run_staging_ahead(slot, instance, taken, staged)
            if ahead is None and _job_only(taken):
                ended = self._clock.now()
                pause = job_pause_s(ended - started, self.arrivals.rate_per_s(ended))
                if pause > 0:
                    await self._yield_to_live(pause)

    async def _run_staging_ahead(
        self, slot: Slot, instance: Runnable, taken: Taken, staged: Staged | None
    ) -> tuple[Taken, Staged] | None:
        """Run ``taken`` on an instance that stages its batches (a handler with
        ``forward``; ``staged``: its inputs already on the device) and, while it computes,
        stage the next batch when the queue holds a full one (:meth:`_stage_ahead`).
        Below a full batch nothing is taken early, so batches are as large as without
        the pipeline. The batch staged ahead, if any: the next turn runs it."""
        run = asyncio.ensure_future(
            self._run_batch(slot, instance, taken.batch, taken.rows, taken.blocks, staged)
        )
        ahead = await self._stage_ahead(slot, instance, run, taken)
        try:
            await run
        except BaseException:
            if ahead is not None:  # never left unanswered
                ahead[1].release()
                self._fail(
                    ahead[0].batch,
                    ahead[0].rows,
                    Unavailable(f"{self.name}: stopped before the batch ran"),
                )
            raise
        return ahead

    async def _stage_ahead(
        self, slot: Slot, instance: Runnable, run: asyncio.Future[None], running: Taken
    ) -> tuple[Taken, Staged] | None:
        """While ``run`` (of ``running``) goes, take the next batch once the plan says
        flush a full one now, and stage it; None if ``run`` ended first. Nothing is staged
        after a batch of job records alone while live requests arrive: the slot pauses
        for them after it (``job_pause_s``), as without the pipeline."""
        if _job_only(running) and job_pause_s(1.0, self.arrivals.rate_per_s(self._clock.now())):
            return None
        while not run.done():
            if self.closing or slot.retired or not instance.alive:
                return None
            now = self._clock.now()
            plan = self._plan(now)
            if plan.wait_s <= 1e-6 and self._queue.rows >= plan.size:
                taken = self._take(plan.size, now)
                if not taken.batch:
                    continue
                inputs = _rows(taken.batch) if taken.blocks else [p.inputs for p in taken.batch]
                try:
                    staged = await self._pool.stage(instance, inputs)
                except Exception as exc:
                    self._fail(taken.batch, taken.rows, run_failure(exc, self.version, "staging"))
                    continue
                return taken, staged
            self._wake.clear()
            woken = asyncio.ensure_future(  # an arrival, or the plan's wait running out
                self._clock.wait(self._wake, plan.wait_s)
                if plan.wait_s > 1e-6
                else self._wake.wait()
            )
            await asyncio.wait((run, woken), return_when=asyncio.FIRST_COMPLETED)
            woken.cancel()
        return None

    def _take(self, size: int, now: float) -> Taken:
        taken = self._queue.take(size, now)
        self._admission.queued -= taken.removed
        for pending in taken.expired:
            self._expire(pending)
        for pending in taken.abandoned:
            self._abandon(pending)
        return taken

    def _fail(self, batch: list[Pending], rows: int, error: BaseException) -> None:
        self._stats.errors += rows
        for p in batch:
            if not p.future.done():
                p.future.set_exception(error)

    async def _yield_to_live(self, pause_s: float) -> None:
        """Leave the instance to live requests for ``pause_s`` after a batch of job
        records: ended at once by a live request in the queue."""
        deadline = self._clock.now() + pause_s
        while not self._queue.live() and not self.closing:
            left = deadline - self._clock.now()
            if left <= 0:
                return
            self._wake.clear()
            await self._clock.wait(self._wake, left)

    async def _run_batch(
        self,
        slot: Slot,
        instance: Any,
        batch: list[Pending],
        rows: int,
        blocks: bool = False,
        staged: Staged | None = None,
    ) -> None:
        """Run one batch on ``instance`` and answer its requests (``rows``: the handler's
        requests in it; ``blocks``: some are blocks of job records, answered a list each;
        ``staged``: its inputs already on the device, staged while the last batch ran)."""
        started = self._clock.now()
        started_ns = time.time_ns()
        failure: BaseException | None = None
        stats = self._stats
        totals = stats.totals
        waits_s = [started - p.enqueued_at for p in batch]
        stats.queue_wait.extend(waits_s)
        totals.queue.add(sum(waits_s), len(waits_s))
        ran: Ran | None = None
        span = self._events.batch_started(self.version, batch, started_ns)
        trace = None
        if span is not None and span.recording:  # handler spans (OTel API) go under it
            trace = (f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}")
        try:
            if staged is not None:
                ran = await self._pool.run_staged(slot, instance, staged, trace)
            else:
                inputs = _rows(batch) if blocks else [p.inputs for p in batch]
                ran = await self._pool.run(slot, instance, inputs, trace)
        except Exception as exc:
            failure = exc
            stats.errors += rows
            error = run_failure(exc, self.version, f"a batch of {rows}")
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(error)
        else:
            if blocks:
                _answer_blocks(batch, ran.results)
            else:
                for p, result in zip(batch, ran.results, strict=True):
                    if not p.future.done():
                        p.future.set_result(result)
        finally:
            elapsed = self._clock.now() - started
            self.cost.observe(rows, elapsed)
            stats.compute.add(elapsed)
            stats.batches += 1
            stats.batch_sizes[rows] += 1
            if ran is not None:  # handing inputs over: the rest of the batch's time
                handed_s = max(elapsed - ran.infer_s - ran.output_s, 0.0)
                totals.batch(rows, handed_s, ran.infer_s, ran.output_s)
            spans = ran.spans if ran is not None else ()
            self._events.batch(
                self.version, batch, waits_s, started_ns, elapsed, failure, span, spans, rows
            )


def _job_only(taken: Taken) -> bool:
    """A batch of job records alone (no live request in it)."""
    return taken.blocks and all(p.priority is Priority.JOB for p in taken.batch)


def _rows(batch: list[Pending]) -> list[Request]:
    """The handler's requests of a batch holding blocks of job records, in order."""
    inputs: list[Request] = []
    for p in batch:
        if p.block is not None:
            inputs.extend(p.block)
        else:
            inputs.append(p.inputs)
    return inputs


def _answer_blocks(batch: list[Pending], results: list[Any]) -> None:
    """Each request its result, and each block the list of its records' results."""
    at = 0
    for p in batch:
        rows = p.rows
        if not p.future.done():
            answer: Any = results[at] if p.block is None else results[at : at + rows]
            p.future.set_result(answer)
        at += rows
