"""The queue of one function version and the loop that turns it into batches.

Calls are admitted into a bounded :class:`~fnrt.runtime.queue.RequestQueue`
(per version and, through :class:`~fnrt.runtime.intake.Admission`, per node;
beyond either, Overloaded -> 429 with ``Retry-After``; deadlines: ``intake.py``). Each slot of the
:class:`~fnrt.runtime.pool.InstancePool` has a worker task here that takes
batches off the shared queue as the pure batching decision says (fixed or
adaptive, :mod:`fnrt.runtime.batching`), runs them on its instance and
answers each request. The loop also asks the pool to scale up while the
queue stays deep.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from fnrt.functions.errors import FnrtError, Unavailable
from fnrt.functions.handler import Request
from fnrt.loader.instance import Ran, Runnable
from fnrt.loader.process import ProcessInstance
from fnrt.loader.staging import Staged, rows_disagree
from fnrt.runtime.batching import (
    Plan,
    adaptive_plan,
    flush_delay_s,
    job_pause_s,
    may_send_ahead,
    predicted_finish_s,
)
from fnrt.runtime.breaker import BreakerState
from fnrt.runtime.events import StartKind
from fnrt.runtime.intake import Admission, Intake
from fnrt.runtime.pool import Slot, run_failure
from fnrt.runtime.protection import Served
from fnrt.runtime.queue import Call, Outputs, Priority, Taken

log = logging.getLogger("fnrt.batcher")

__all__ = ["Admission", "Batcher"]


#: How long a version's first load is taken to last, for the deadlines of the
#: requests its first batch would send during it (later loads: the last one's).
FIRST_LOAD_GUESS_S = 5.0


class Batcher(Intake):
    """Queue and batch loop of one function version."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # by slot index: what an arrival starts once the queue may make the next batch,
        # while the slot runs a lone request's batch (:meth:`_run_watching`)
        self._on_arrival: dict[int, Callable[[], None]] = {}
        # bytes inputs travel in a worker's message, not its arena: none is sent early
        self._inline_inputs = any(
            spec.dtype == "bytes" for spec in self.version.manifest.inputs.values()
        )

    # --- admission ---------------------------------------------------------------------

    def submit(self, call: Call) -> asyncio.Future[Served]:
        """Admit one call (raising at once if it may not join) and queue it; its future
        is answered with its :class:`Served` when its batch has run, or with its error
        (DeadlineExceeded when ``timeout_s`` passed first, the batch's HandlerFailed).
        Not a coroutine: the caller awaits the future itself, one frame less."""
        if self._pool.stages:  # a forward handler: a request whose rows disagree is its 422
            refused = rows_disagree(call.inputs)
            if refused is not None:
                raise refused
        now = call.enqueued_at
        self._admission.check(self)
        if self._manifest.batching.adaptive:
            self._refuse_late(call.deadline - now if call.deadline is not None else None)
        call.cold = self._pool.starts.count(now) is StartKind.COLD
        self._push(call)
        return call.future

    def submit_block(self, records: list[Request]) -> asyncio.Future[list[Outputs]]:
        """Queue a block of job records (at most a batch of them) at job priority: they
        join one batch together, each a request of the handler's own; the outputs of
        each, in order. One future and one queue entry for the block: a job's records
        cost the event loop next to nothing each. No latency target applies to a job's
        records (adaptive batching's refusal is for live requests)."""
        self._admission.check(self)
        now = self._clock.now()
        call = Call({}, asyncio.get_running_loop().create_future(), now, Priority.JOB)
        call.block, call.rows = records, len(records)
        call.cold = self._pool.starts.count(now) is StartKind.COLD
        self._push(call)
        return call.future

    def _push(self, call: Call) -> None:
        super()._push(call)
        if self._on_arrival and self._may_stage():
            for index in list(self._on_arrival):
                self._on_arrival.pop(index)()

    def _may_stage(self) -> bool:
        """Whether the queue may now hold the next batch to stage ahead: a full one for
        fixed batching (its plan's size is always the largest); any for adaptive."""
        batching = self._manifest.batching
        return batching.adaptive or self._queue.rows >= batching.max_batch_size

    def _refuse_late(self, timeout_s: float | None) -> None:
        """Unavailable unless a request can finish within the adaptive target."""
        batching = self._manifest.batching
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

    # --- the loop ----------------------------------------------------------------------

    def _serve(self, slot: Slot) -> None:
        self._start(self._work(slot))

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

    async def _work(self, slot: Slot) -> None:
        pool = self._pool
        ahead: tuple[Taken, Staged] | None = None  # the next batch, staged while one ran
        instance: Runnable | None = None
        taken: Taken | None = None
        while ahead is not None or not slot.retired:
            self._maybe_scale_up(self._clock.now())
            if ahead is None and not self._queue:
                if self.closing:
                    return
                # idle: hold neither the last batch nor its instance (unloaded meanwhile,
                # it is freed at once, not at this function's next call)
                instance = taken = None
                self._wake.clear()
                await self._wake.wait()
                continue
            if ahead is not None and self.closing and slot.instance is None:
                # its instance was stopped (a shutdown past its time) or lost while the
                # version closes: the batch staged (or sent) ahead is cut off, not rerun
                ahead[1].release()
                error = Unavailable(f"function '{self.name}': stopped before the batch ran; retry")
                self._fail(ahead[0].batch, ahead[0].rows, error)
                ahead = None
                continue
            try:
                if ahead is None and slot.instance is None:  # a cold start: see its load
                    instance, ahead = await self._load_sending_early(slot)
                else:
                    instance = await pool.ensure(slot)
            except FnrtError as exc:
                if ahead is not None:  # staged on an instance that was lost; none comes
                    ahead[1].release()
                    self._fail(ahead[0].batch, ahead[0].rows, exc)
                    ahead = None
                if slot.primary:
                    if pool.instances == 0:  # nobody else can serve them
                        self.fail_queued(exc)
                    elif self.closing:  # the others answer what is queued (what is left
                        return  # when every loop has ended: Intake.close fails it)
                    else:  # the other instances serve; try again at the next arrival
                        self._wake.clear()
                        await self._wake.wait()
                    continue
                return  # the pool gave the extra slot up (InstancePool._load)
            staged: Staged | None = None
            if ahead is not None:
                (taken, staged), ahead = ahead, None
                # its requests whose deadline passed while the batch before it ran longer
                # than predicted (may_send_ahead): 504 now, whatever the instance computes
                now = self._clock.now()
                for call in taken.batch:
                    deadline = call.deadline
                    if deadline is not None and now >= deadline and not call.future.done():
                        self._expire(call, now)
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
            elif staged is None and not self._queue and len(taken.batch) == 1:  # a lone request
                ahead = await self._run_watching(slot, instance, taken)
            else:
                ahead = await self._run_staging_ahead(slot, instance, taken, staged)
            if ahead is None and _job_only(taken):
                ended = self._clock.now()
                pause = job_pause_s(ended - started, self.arrivals.rate_per_s(ended))
                if pause > 0:
                    await self._yield_to_live(pause)

    async def _load_sending_early(self, slot: Slot) -> tuple[Runnable, tuple[Taken, Staged] | None]:
        """The slot's instance, loaded now, and the first batch, sent to its worker right
        behind the load message (``ProcessInstance.send_early``) to run as soon as its
        load returns, with no round trip between (about a millisecond of a cold start's
        hops): the requests queued when the message went, as the plan sizes a batch (the
        load is their wait); those arriving during the load make the next batch, sent
        ahead while the first runs. A thread's load, which sends nothing, loads first
        and takes its batch after, as before. A load that fails fails the batch sent
        with its error."""
        early: list[tuple[Taken, Staged]] = []
        waiting = True

        def sent(instance: Runnable) -> None:  # on the loop, when the load message went
            if waiting and not early and isinstance(instance, ProcessInstance):
                sending = self._send_early(slot, instance)
                if sending is not None:
                    early.append(sending)

        try:
            instance = await self._pool.ensure(slot, sent)
        except BaseException as exc:
            waiting = False
            if early:
                (taken, staged) = early[0]
                staged.release()
                error = (
                    exc
                    if isinstance(exc, FnrtError)
                    else Unavailable(f"function '{self.name}': stopped before the batch ran; retry")
                )
                self._fail(taken.batch, taken.rows, error)
            raise
        waiting = False
        return instance, (early[0] if early else None)

    def _send_early(self, slot: Slot, instance: ProcessInstance) -> tuple[Taken, Staged] | None:
        """Take the first batch and send it to ``instance``'s worker while it loads; not
        for a version with ``bytes`` inputs (they travel in the message itself, which
        the loop would then write into a socket nobody reads until the load ends), nor
        while a request it would take may reach its deadline before the load is
        expected to end (it waits in the queue, answered 504 on time)."""
        if not self._queue or self.closing or slot.retired or self._inline_inputs:
            return None
        now = self._clock.now()
        size = self._plan(now).size
        expected_s = self._stats.last_load_timings_s.get("total_s", FIRST_LOAD_GUESS_S)
        if not may_send_ahead(self._queue.earliest_deadline(size), now, expected_s):
            return None
        taken = self._take(size, now)
        if not taken.batch:
            return None
        inputs = _rows(taken.batch) if taken.blocks else [p.inputs for p in taken.batch]
        try:
            return taken, instance.send_early(inputs, self._events.traced)
        except Exception as exc:  # the arena could not hold it (no memory), say
            self._fail(taken.batch, taken.rows, run_failure(exc, self.version, "sending"))
            return None

    async def _run_staging_ahead(
        self, slot: Slot, instance: Runnable, taken: Taken, staged: Staged | None
    ) -> tuple[Taken, Staged] | None:
        """Run ``taken`` on an instance that stages its batches (a handler with
        ``forward``; ``staged``: its inputs already on the device) and, while it computes,
        stage the next batch when the queue holds a full one (:meth:`_stage_ahead`).
        Below a full batch nothing is taken early, so batches are as large as without
        the pipeline. The batch staged ahead, if any: the next turn runs it."""
        started = self._clock.now()
        run = asyncio.ensure_future(
            self._run_batch(slot, instance, taken.batch, taken.rows, taken.blocks, staged)
        )
        ahead = await self._stage_ahead(slot, instance, run, taken, started)
        try:
            await run
        except BaseException:
            self._stopped_before(ahead)
            raise
        return self._kept(ahead, instance)

    async def _run_watching(
        self, slot: Slot, instance: Runnable, taken: Taken
    ) -> tuple[Taken, Staged] | None:
        """Run ``taken``, a lone request's batch (one request, and none queued behind
        it: one connection), as :meth:`_run_staging_ahead` does, but in this task, with
        no task for the run and no watch on the queue until the requests arriving while
        it runs may make the next batch (:meth:`_may_stage`: a full one, for fixed
        batching): then the watch (:meth:`_stage_ahead`, on a task) stages it. A lone
        request costs no task and no wait of its own. (Larger batches keep the task and
        the watch: measured at 32 connections, running them here too was 0.97x.)"""
        started = self._clock.now()
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()
        watch: asyncio.Future[tuple[Taken, Staged] | None] | None = None

        def arrived() -> None:
            nonlocal watch
            watch = asyncio.ensure_future(
                self._stage_ahead(slot, instance, finished, taken, started)
            )

        self._on_arrival[slot.index] = arrived
        try:
            await self._run_batch(slot, instance, taken.batch, taken.rows, taken.blocks)
        except BaseException:
            if watch is not None:  # it ends now (``finished``), with what it staged, if any
                watch.add_done_callback(self._stopped_watching)
            raise
        finally:
            self._on_arrival.pop(slot.index, None)
            finished.set_result(None)
        if watch is None:
            return None
        try:  # shielded: a cancel here leaves the watch to end, its batch failed, not lost
            ahead = await asyncio.shield(watch)
        except BaseException:
            watch.add_done_callback(self._stopped_watching)
            raise
        return self._kept(ahead, instance)

    def _stopped_watching(self, watch: asyncio.Future[tuple[Taken, Staged] | None]) -> None:
        """A watch whose run was stopped: what it staged fails; what it raised is logged."""
        if watch.cancelled():
            return
        error = watch.exception()
        if error is not None:
            log.error("%s: staging the next batch failed", self.name, exc_info=error)
            return
        self._stopped_before(watch.result())

    def _stopped_before(self, ahead: tuple[Taken, Staged] | None) -> None:
        """The batch staged ahead will not run (the run before it was cancelled): failed,
        never left unanswered."""
        if ahead is not None:
            ahead[1].release()
            self._fail(
                ahead[0].batch,
                ahead[0].rows,
                Unavailable(f"{self.name}: stopped before the batch ran"),
            )

    def _kept(
        self, ahead: tuple[Taken, Staged] | None, instance: Runnable
    ) -> tuple[Taken, Staged] | None:
        """The batch staged ahead, to run next, unless its instance died and the
        version's breaker has opened meanwhile (then refused, as the queue is)."""
        if ahead is not None and not instance.alive:
            refused = self._refused()
            if refused is not None:  # not run on the next instance: refused as if queued
                ahead[1].release()
                self._fail(ahead[0].batch, ahead[0].rows, refused)
                return None
        return ahead

    def _refused(self) -> FnrtError | None:
        """CircuitOpen while the version's breaker is open (its instances die in a row):
        a batch staged ahead on an instance that died is refused with the queue."""
        protection = self._protection
        if protection is None or protection.breaker.state is not BreakerState.OPEN:
            return None
        return protection.refusal(self.name, self.version.version, self._clock.now())

    async def _stage_ahead(
        self,
        slot: Slot,
        instance: Runnable,
        run: asyncio.Future[None],
        running: Taken,
        started: float,
    ) -> tuple[Taken, Staged] | None:
        """While ``run`` (of ``running``, since ``started``) goes, take the next batch
        once the plan says flush a full one now, and stage it; None if ``run`` ended
        first. Nothing is staged after a batch of job records alone while live requests
        arrive: the slot pauses for them after it (``job_pause_s``), as without the
        pipeline; nor while a request it would take may reach its deadline before
        ``run`` ends (``may_send_ahead``): it waits in the queue, answered 504 on time."""
        if _job_only(running) and job_pause_s(1.0, self.arrivals.rate_per_s(self._clock.now())):
            return None
        wake = self._wake
        run.add_done_callback(lambda _: wake.set())
        plan: Plan | None = None
        while not run.done():
            if not self._queue:  # nothing to stage (a lone request's batch): await an arrival
                plan = None
            elif self.closing or slot.retired or not instance.alive:
                return None
            else:
                now = self._clock.now()
                plan = self._plan(now)
            if plan is not None and plan.wait_s <= 1e-6 and self._queue.rows >= plan.size:
                if not may_send_ahead(
                    self._queue.earliest_deadline(plan.size),
                    now,
                    self._left_s(running, started, now),
                ):
                    return None
                taken = self._take(plan.size, now)
                if not taken.batch:
                    continue
                inputs = _rows(taken.batch) if taken.blocks else [p.inputs for p in taken.batch]
                try:
                    staged = await instance.stage_soon(inputs, self._events.traced)
                except Exception as exc:
                    self._fail(taken.batch, taken.rows, run_failure(exc, self.version, "staging"))
                    continue
                return taken, staged
            self._wake.clear()
            if run.done():
                break
            # an arrival, the plan's wait running out, or the run's end (it sets the same
            # event): awaited here, not in a task of its own raced against ``run`` (two
            # tasks and a wait a batch, on every batch of a worker process)
            if plan is not None and plan.wait_s > 1e-6:
                await self._clock.wait(self._wake, plan.wait_s)
            else:
                await self._wake.wait()
        return None

    def _left_s(self, running: Taken, started: float, now: float) -> float | None:
        """What the batch running since ``started`` is predicted still to take (None:
        the cost model has seen no batch yet)."""
        if not self.cost.fitted:
            return None
        return max(self.cost.predict(running.rows) - (now - started), 0.0)

    def _fail(self, batch: list[Call], rows: int, error: BaseException) -> None:
        self._settle_failed(batch, error, self._clock.now())

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

    def _answer(self, batch: list[Call], results: list[Any]) -> None:
        """Each call its result; latency totals once, and the breaker and canary window
        for the calls that passed the gateway."""
        now = self._clock.now()
        tier = self._stats.last_load_tier
        protection = self._protection
        total = 0.0
        answered = 0
        counted: list[float] = []  # the latencies of those that passed the gateway
        for call, result in zip(batch, results, strict=True):
            future = call.future
            if future.done():
                continue
            future.set_result(Served(result, tier if call.cold else None))
            latency = now - call.enqueued_at
            total += latency
            answered += 1
            if call.counted:
                counted.append(latency)
        if counted and protection is not None:
            protection.all_succeeded(now, counted)
        if answered:
            totals = self._stats.totals
            totals.success.add(total, answered)
            totals.last_request_unix_s = time.time()

    async def _run_batch(
        self,
        slot: Slot,
        instance: Any,
        batch: list[Call],
        rows: int,
        blocks: bool = False,
        staged: Staged | None = None,
    ) -> None:
        """Run one batch on ``instance`` and answer its requests (``rows``: the handler's
        requests in it; ``blocks``: some are blocks of job records, answered a list each;
        ``staged``: its inputs already on the device, staged while the last batch ran).

        With nothing queued or staged behind it, its answers are written before the
        batch is accounted (:func:`answers_written`: statistics, cost model, breaker,
        metrics and spans; and the slot's next turn), which would otherwise delay them:
        a lone request's answer, about 70 us of the event loop's. With requests queued,
        or a batch staged ahead, the slot goes on at once (yielding there cost 0.59x at
        32 connections)."""
        started = self._clock.now()
        started_ns = staged.sent_ns if staged is not None and staged.sent_ns else time.time_ns()
        failure: BaseException | None = None
        stats = self._stats
        totals = stats.totals
        waits_s = [started - p.enqueued_at for p in batch]
        stats.queue_wait.extend(waits_s)
        totals.queue.add(sum(waits_s), len(waits_s))
        ran: Ran | None = None
        elapsed: float | None = None
        ended_ns = 0  # set when the batch is accounted after its end (its span ends then)
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
            error = run_failure(exc, self.version, f"a batch of {rows}")
            self._settle_failed(batch, error, self._clock.now())
        else:
            if blocks:
                _answer_blocks(batch, ran.results, self._stats.last_load_tier)
                now = self._clock.now()
                totals.success.add(sum(now - p.enqueued_at for p in batch), len(batch))
                totals.last_request_unix_s = time.time()
            else:
                self._answer(batch, ran.results)
                if not self._queue and (instance.stager is None or slot.index in self._on_arrival):
                    # nothing queued, and none staged ahead (a lone batch's watch not started)
                    elapsed = self._clock.now() - started
                    ended_ns = time.time_ns()
                    # no watch from here on: a request arriving meanwhile is queued and
                    # taken next, not staged behind this accounting (or onto an instance
                    # dropped while the slot waits: it is idle now)
                    self._on_arrival.pop(slot.index, None)
                    await answers_written()
        finally:
            if elapsed is None:
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
                self.version,
                batch,
                waits_s,
                started_ns,
                elapsed,
                failure,
                span,
                spans,
                rows,
                ended_ns,
            )


async def answers_written() -> None:
    """Two turns of the event loop: the answers set before this are written by then
    (their futures' callbacks run in the next turn, and the connections' one write of
    that turn's answers in the turn after it: ``OneWrite``)."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


def _job_only(taken: Taken) -> bool:
    """A batch of job records alone (no live request in it)."""
    return taken.blocks and all(p.priority is Priority.JOB for p in taken.batch)


def _rows(batch: list[Call]) -> list[Request]:
    """The handler's requests of a batch holding blocks of job records, in order."""
    inputs: list[Request] = []
    for p in batch:
        if p.block is not None:
            inputs.extend(p.block)
        else:
            inputs.append(p.inputs)
    return inputs


def _answer_blocks(batch: list[Call], results: list[Any], tier: Any) -> None:
    """Each request its result, and each block the list of its records' results."""
    at = 0
    for p in batch:
        rows = p.rows
        if not p.future.done():
            if p.block is None:
                p.future.set_result(Served(results[at], tier if p.cold else None))
            else:
                p.future.set_result(results[at : at + rows])
        at += rows
