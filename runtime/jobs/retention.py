"""How long a job stays in the store: an ended job's folder (its records and results)
for ``--job-retention-s`` after it ended, a submit's left by a node that died mid-way
for a day after it began. Every node sweeps a page of job folders at a time, now and
then (``JobConfig.sweep_interval_s``); removing a folder twice is harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
from collections.abc import Callable

from fnrt.runtime.jobs.board import ID_LENGTH, JobBoard, JobNotFound, StateDoc, is_id

log = logging.getLogger("fnrt.jobs")

#: A job folder with no state (a submit whose node died before it was queued) is
#: removed this long after the submit began: no submit writes its records for longer.
ORPHAN_AFTER_S = 86_400.0
#: Job folders looked at per page of a sweep.
SWEEP_PAGE = 100
#: Ended jobs a node remembers the expiry of, sparing a read of their state per sweep.
KNOWN_KEPT = 100_000


def created_unix_s(job: str) -> float:
    """When ``job`` was submitted, from its id (:func:`~fnrt.runtime.jobs.board.new_id`)."""
    return int(job[: ID_LENGTH - 12], 16) / 1000.0


def expired(
    now_unix_s: float, retention_s: float, created_s: float, state: StateDoc | None
) -> bool:
    """Whether a job's folder goes now: an ended job's once ``retention_s`` has passed
    since it ended (0: never), one with no state (never queued) once
    :data:`ORPHAN_AFTER_S` has passed since it began; never one still under way."""
    if state is None:
        return now_unix_s - created_s >= ORPHAN_AFTER_S
    if not state.state.final or retention_s <= 0:
        return False
    ended = state.finished_unix_s if state.finished_unix_s is not None else created_s
    return now_unix_s - ended >= retention_s


def sweep_page(
    board: JobBoard,
    now_unix_s: float,
    retention_s: float,
    after: str = "",
    known: dict[str, float] | None = None,
) -> tuple[list[str], str | None]:
    """The job folders of one page after ``after``, the expired ones removed: their ids,
    and where the next page starts (None: no folder after it can have expired yet).

    Ids sort by submit time, so the sweep stops at the first job too young to have
    expired whatever its state. ``known`` (job -> the time before which it cannot
    expire, kept by the caller between sweeps, at most :data:`KNOWN_KEPT`) spares a
    read of each ended job's state at every sweep: an ended job's state no longer
    changes. A job that cannot be read or removed is logged and passed: the others go."""
    known = {} if known is None else known
    youngest = now_unix_s - min(retention_s if retention_s > 0 else math.inf, ORPHAN_AFTER_S)
    page = board.listing(after, SWEEP_PAGE)
    removed: list[str] = []
    for job in page:
        if not is_id(job) or now_unix_s < known.get(job, -math.inf):
            continue
        created = created_unix_s(job)
        if created > youngest:
            return removed, None
        try:
            if _swept(board, job, now_unix_s, retention_s, created, known):
                removed.append(job)
        except Exception:  # this job's (a state another version wrote, say): not the rest
            log.exception("jobs: job %s could not be looked at for its retention", job)
    return removed, (page[-1] if len(page) == SWEEP_PAGE else None)


def _swept(
    board: JobBoard,
    job: str,
    now_unix_s: float,
    retention_s: float,
    created: float,
    known: dict[str, float],
) -> bool:
    """Remove ``job``'s folder if it expired (True), or note when an ended one may."""
    try:
        state: StateDoc | None = board.state(job)[0]
    except JobNotFound:
        state = None
    if expired(now_unix_s, retention_s, created, state):
        board.discard(job)
        board.forget(job)
        known.pop(job, None)
        return True
    if state is not None and state.state.final and len(known) < KNOWN_KEPT:
        ended = state.finished_unix_s if state.finished_unix_s is not None else created
        known[job] = ended + retention_s if retention_s > 0 else math.inf
    return False


class Retention:
    """A node's sweep of the job folders past their retention: a task of its own (job
    work goes on meanwhile), every ``interval_s`` on the monotonic clock, the first after
    a random part of one (nodes started together do not sweep together)."""

    def __init__(
        self,
        board: JobBoard,
        retention_s: float,
        interval_s: float,
        first: Callable[[], float] = random.random,
    ) -> None:
        self.board = board
        self.retention_s = retention_s
        self.interval_s = interval_s
        self._first = first
        #: ended jobs: when each may go (``sweep_page``), sparing reads of their state
        self.expiries: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="fnrt-job-retention")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def sweep(self) -> int:
        """One sweep, a page at a time off the event loop; how many folders went."""
        board, known = self.board, self.expiries
        now = board.clock()
        after: str | None = ""
        removed = 0
        while after is not None:
            gone, after = await asyncio.to_thread(
                sweep_page, board, now, self.retention_s, after, known
            )
            removed += len(gone)
        for job in [j for j, due in known.items() if due <= now]:
            del known[job]  # due, and not seen this sweep: another node removed it
        if removed:
            log.info("jobs: removed %d job folders past their retention", removed)
        return removed

    async def _loop(self) -> None:
        await asyncio.sleep(self.interval_s * self._first())
        while True:
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("jobs: removing job folders past their retention failed")
            await asyncio.sleep(self.interval_s)
