"""A node's share of the jobs: take chunks from the board, run their records through
the function's own batcher at the lowest priority, write the results.

Job records queue as ``Priority.JOB``: they never age into a live class, so a
batch takes them only where live requests leave room, and a chunk keeps at most
a window of records queued (a few batches), so live requests are never refused
for a backlog. A function at zero is loaded by the first record, as by a call.
A record that fails is tried again on its own once the chunk's pass is over (a
batch's failure fails every record in it; alone, only the record at fault fails
again), then kept as failed with its reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from math import inf
from typing import Any

import orjson

from fnrt.functions.errors import (
    BadRequest,
    CorruptBlob,
    EnvironmentFailed,
    FnrtError,
    InvalidInput,
    LoadError,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    ResponseTooLarge,
    StoreError,
    Unavailable,
    VersionRetired,
)
from fnrt.functions.generation import join_chunks
from fnrt.runtime import scheduler as sched
from fnrt.runtime.jobs.board import (
    JobBoard,
    JobNotFound,
    JobState,
    JobStatus,
    Lease,
    Outcome,
    Record,
    failed_outcome,
    ok_outcome,
    outcomes_failed,
)
from fnrt.runtime.jobs.retention import Retention
from fnrt.runtime.queue import Priority
from fnrt.runtime.registry import Registry
from fnrt.runtime.scheduler import Scheduler

log = logging.getLogger("fnrt.jobs")

#: Errors a record keeps at once: trying it again would fail the same way.
_FINAL = (InvalidInput, BadRequest, PayloadTooLarge, ResponseTooLarge, NotFound)
#: Errors that say the chunk cannot run here now, whatever its records: the version
#: does not load, the store or the node is unavailable. The chunk is given back.
_NOT_THE_RECORDS = (LoadError, Unavailable, StoreError, EnvironmentFailed, CorruptBlob)


#: Tries of a version found retiring (0.05 s apart) before its chunk is given back.
RETIRED_TRIES = 100


class GiveBack(Exception):
    """The chunk goes back to the queue (counted as an attempt), saying why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class JobConfig:
    """How a node takes part in jobs (``fnrt serve --job-*``)."""

    enabled: bool = True
    poll_interval_s: float = 1.0  # how often the node looks for chunks to take
    lease_s: float = 30.0  # a chunk's hold; renewed at a third of it while it runs
    chunks_per_node: int = 2  # chunks one node runs at once
    max_attempts: int = 3  # holds of one chunk before its records are failed
    record_retries: int = 2  # tries of a failed record on its own
    window_batches: int = 2  # blocks (a batch of records each) a chunk keeps queued
    retention_s: float = 7 * 86_400.0  # an ended job's folder is kept this long (0: for good)
    sweep_interval_s: float = 600.0  # how often the node removes job folders past it


#: Sends a finished job's status to its webhook (the runner's own by default).
Notify = Callable[[str, dict[str, Any]], Awaitable[None]]


class JobRunner:
    """Takes and runs chunks while the node serves."""

    def __init__(
        self,
        board: JobBoard,
        registry: Registry,
        config: JobConfig,
        serving: Callable[[], bool],
        notify: Notify | None = None,
    ) -> None:
        self.board = board
        self._registry = registry
        self.config = config
        self._serving = serving  # False once the node drains: take nothing new
        self._notify = notify or post_webhook
        self._running: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._started_jobs: set[str] = set()
        self._telling: set[asyncio.Future[None]] = set()  # webhooks of cancelled jobs
        #: Records waiting or running, by function (for /metrics and KEDA).
        self.queued_records: dict[str, int] = {}
        #: removes the job folders past their retention, beside the job work
        self.retention = Retention(board, config.retention_s, config.sweep_interval_s)

    def start(self) -> None:
        if self.config.enabled and self._task is None:
            self._task = asyncio.create_task(self._loop(), name="fnrt-jobs")
            self.retention.start()

    def poke(self) -> None:
        """Look for work now (a job was just submitted here)."""
        self._wake.set()

    @property
    def running(self) -> int:
        return len(self._running)

    async def cancel(self, job: str) -> JobStatus:
        """Cancel ``job`` (Conflict when it has ended already) and tell its webhook, as an
        ending job's is told: in the background, the answer not waiting for it."""
        board = self.board
        cancelled = await asyncio.to_thread(board.cancel, job)
        if cancelled.spec.webhook:
            told: asyncio.Future[None] = asyncio.ensure_future(
                self._notify(cancelled.spec.webhook, cancelled.to_dict(board.clock()))
            )
            self._telling.add(told)
            told.add_done_callback(self._telling.discard)
        return cancelled

    async def close(self) -> None:
        """Stop taking chunks; those running are stopped and given back to the fleet."""
        await self.retention.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, *self._telling, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            try:
                await self._poll()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("jobs: looking for work failed; trying again")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.poll_interval_s):
                    await self._wake.wait()

    async def _poll(self) -> None:
        board = self.board
        queued = await asyncio.to_thread(board.queued)
        counts: dict[str, int] = {}
        self._started_jobs &= set(queued)
        for job in queued:
            try:
                await self._look_at(job, counts)
            except JobNotFound:  # its folder was removed: its queue entry goes too
                log.warning("job %s is queued but gone from the store: forgotten", job)
                await asyncio.to_thread(board.forget, job)
            except Exception:  # this job's, not the jobs' after it
                log.exception("jobs: looking at job %s failed; trying again", job)
        self.queued_records = counts

    async def _look_at(self, job: str, counts: dict[str, int]) -> None:
        """End a queued job that has ended, or take chunks of it while this node has
        room; its records left are added to ``counts`` (by function)."""
        board = self.board
        status = await asyncio.to_thread(board.status, job)
        spec = status.spec
        if status.state.state.final:
            await asyncio.to_thread(board.forget, job)
            return
        if status.chunks_done == spec.chunks:  # its last chunk's node died ending it
            await self._end(job)
            return
        left = spec.records - status.records_done
        counts[spec.function] = counts.get(spec.function, 0) + left
        while self._serving() and len(self._running) < self.config.chunks_per_node:
            # never a chunk this node still runs (its lease ran out while it computed)
            mine = {chunk for held, chunk in self._running if held == job}
            lease = await asyncio.to_thread(board.claim, job, self.config.lease_s, mine)
            if lease is None:
                break
            if job not in self._started_jobs:
                try:
                    await asyncio.to_thread(board.mark_running, job)
                except BaseException:  # its chunk goes back at once, no attempt counted
                    await asyncio.shield(
                        asyncio.to_thread(board.release, lease, "its node failed", counted=False)
                    )
                    raise
                self._started_jobs.add(job)
            key = (job, lease.chunk)
            self._running[key] = asyncio.create_task(self._run(lease), name=f"fnrt-job-{job}")

    async def _run(self, lease: Lease) -> None:
        board = self.board
        key = (lease.job, lease.chunk)
        holder = _Holder(lease)
        renewing = asyncio.create_task(self._renew(holder))
        try:
            spec = await asyncio.to_thread(board.spec, lease.job)
            state, _ = await asyncio.to_thread(board.state, lease.job)
            if state.state is JobState.CANCELLED:
                await asyncio.to_thread(board.release, holder.lease, "cancelled", counted=False)
                return
            if lease.attempt > self.config.max_attempts:
                results = outcomes_failed(
                    spec.chunk_size(lease.chunk),
                    f"the chunk was tried {lease.attempt - 1} times and never finished; "
                    f"the last time: {lease.reason or 'its node died or stalled'}",
                    type="ChunkFailed",
                )
            else:
                records = await asyncio.to_thread(board.chunk_inputs, lease.job, lease.chunk)
                results = await self._compute(spec.function, spec.version, records)
            renewing.cancel()
            await asyncio.to_thread(board.finish_chunk, holder.lease, results)
            await self._end(lease.job)
        except asyncio.CancelledError:  # the node stops: another takes the chunk at once
            with contextlib.suppress(Exception):
                stopping = asyncio.to_thread(
                    board.release, holder.lease, "its node stopped", counted=False
                )
                await asyncio.shield(stopping)
            raise
        except GiveBack as exc:
            log.warning("job %s chunk %d given back: %s", lease.job, lease.chunk, exc.reason)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(board.release, holder.lease, exc.reason)
        except Exception as exc:
            log.exception("job %s chunk %d failed; giving it back", lease.job, lease.chunk)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(board.release, holder.lease, f"{type(exc).__name__}: {exc}")
        finally:
            renewing.cancel()
            self._running.pop(key, None)
            self._wake.set()  # room for another chunk

    async def _end(self, job: str) -> None:
        """End the job if every chunk is done; the node whose write ends it calls the
        webhook."""
        board = self.board
        ended = await asyncio.to_thread(board.complete, job)
        if ended is not None:
            log.info("job %s %s", job, ended.state.state.value)
            if ended.spec.webhook:
                await self._notify(ended.spec.webhook, ended.to_dict(board.clock()))

    async def _renew(self, holder: _Holder) -> None:
        every_s = self.config.lease_s / 3
        while True:
            await asyncio.sleep(every_s)
            try:
                renewed = await asyncio.to_thread(
                    self.board.renew, holder.lease, self.config.lease_s
                )
            except Exception as exc:  # the store, for now: renewing goes on
                log.warning(
                    "job %s chunk %d: renewing its lease failed (%s); trying again",
                    holder.lease.job,
                    holder.lease.chunk,
                    exc,
                )
                continue
            if renewed is None:
                log.warning(
                    "job %s chunk %d: another node took it (this one was too slow); "
                    "the first results written are kept",
                    holder.lease.job,
                    holder.lease.chunk,
                )
                return
            holder.lease = renewed

    async def _compute(self, function: str, version: str, records: list[Record]) -> list[Outcome]:
        """Every record's outcome, in order: a pass in blocks of a batch each (a few
        queued at a time), then the records of failed blocks again, each alone. Raises
        GiveBack when the chunk cannot run here now (the version does not load, the
        store or the node is unavailable): not the records' fault."""
        results: list[Outcome | None] = [None] * len(records)
        errors: dict[int, FnrtError] = {}
        try:
            # read from the store whatever a request's 404 noted: a job's function may
            # have been deployed through another node a moment ago
            scheduler = await self._registry.get_version(function, version, fresh=True)
        except NotFound as exc:  # the function or its version was deleted
            return [failed_outcome(exc) for _ in records]
        size = scheduler.version.manifest.batching.max_batch_size
        if scheduler.sequencer is not None:
            size = 1  # a generative function takes its records one by one
        limit = asyncio.Semaphore(self.config.window_batches)

        async def block(start: int) -> None:
            async with limit:
                part = records[start : start + size]
                try:
                    outcomes = await self._submit(function, version, part)
                except _NOT_THE_RECORDS as exc:
                    raise GiveBack(f"{type(exc).__name__}: {exc.message}") from exc
                except FnrtError as exc:
                    for index in range(start, start + len(part)):
                        errors[index] = exc
                    return
                results[start : start + len(part)] = outcomes

        try:
            async with asyncio.TaskGroup() as group:
                for start in range(0, len(records), size):
                    group.create_task(block(start))
        except* GiveBack as raised:
            raise raised.exceptions[0] from None
        for index, error in sorted(errors.items()):
            for _ in range(self.config.record_retries):
                if isinstance(error, _FINAL):
                    break
                try:
                    (results[index],) = await self._submit(
                        function, version, [records[index]], alone=True
                    )
                    break
                except _NOT_THE_RECORDS as exc:
                    raise GiveBack(f"{type(exc).__name__}: {exc.message}") from exc
                except FnrtError as exc:
                    error = exc
            if results[index] is None:
                results[index] = failed_outcome(error)
        return [r for r in results if r is not None]

    async def _submit(
        self, function: str, version: str, records: list[Record], *, alone: bool = False
    ) -> list[Outcome]:
        """Records through the version's batcher at job priority: a block of them in
        one batch, or one record in a batch of its own (``alone``). Waits while the
        queue is full rather than failing them."""
        retired = 0
        while True:
            scheduler = await self._registry.get_version(function, version, fresh=True)
            try:
                if scheduler.sequencer is not None:
                    return [await self._generate(scheduler, records[0])]
                if alone:  # no deadline: a job's records wait behind live ones (as a block's)
                    served = await sched.submit(
                        scheduler, records[0], priority=Priority.JOB, alone=True, timeout_s=inf
                    )
                    return [ok_outcome(served.outputs)]
                return [ok_outcome(o) for o in await sched.submit_block(scheduler, records)]
            except Overloaded as exc:
                await asyncio.sleep(min(max(exc.retry_after_s, 0.05), 1.0))
            except VersionRetired:  # swapped out between choice and queue: ask again
                retired += 1
                if retired == RETIRED_TRIES:
                    raise
                await asyncio.sleep(0.05)

    async def _generate(self, scheduler: Scheduler, record: Record) -> Outcome:
        """A generative function's answer to one record: every chunk, joined."""
        served = await sched.submit(scheduler, record, priority=Priority.JOB, timeout_s=inf)
        assert served.stream is not None
        chunks = [chunk async for chunk in served.stream]
        return ok_outcome(join_chunks(scheduler.version.manifest.outputs, chunks))


class _Holder:
    """The lease a chunk holds now (renewals replace it)."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease


async def post_webhook(url: str, status: dict[str, Any]) -> None:
    """POST a finished job's status to ``url``: three tries, ten seconds each."""
    import httpx

    body = orjson.dumps(status)
    async with httpx.AsyncClient(timeout=10.0) as client:
        for attempt in range(3):
            try:
                response = await client.post(
                    url, content=body, headers={"content-type": "application/json"}
                )
                if response.status_code < 500:
                    return
            except httpx.HTTPError as exc:
                log.warning("job webhook %s: %s", url, exc)
            await asyncio.sleep(0.5 * 2**attempt)
    log.warning("job webhook %s: gave up after three tries", url)
