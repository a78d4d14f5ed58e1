"""How long a job stays in the store: ended jobs past their retention, and submits a
dead node left unqueued, are removed; everything else stays."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from fnrt.loader.stores import FileStore
from fnrt.runtime.jobs import retention
from fnrt.runtime.jobs.board import JobBoard, JobNotFound, JobSpec, JobState, StateDoc, new_id
from fnrt.runtime.jobs.retention import (
    ORPHAN_AFTER_S,
    SWEEP_PAGE,
    Retention,
    created_unix_s,
    expired,
    sweep_page,
)

DAY = 86_400.0


def test_an_ended_job_goes_once_its_retention_has_passed_and_never_one_under_way() -> None:
    ended = StateDoc(state=JobState.DONE, finished_unix_s=1000.0)
    assert not expired(1000.0 + DAY - 1, DAY, 0.0, ended)
    assert expired(1000.0 + DAY, DAY, 0.0, ended)
    assert not expired(1e12, 0.0, 0.0, ended)  # 0: kept for good
    for state in (JobState.QUEUED, JobState.RUNNING):
        assert not expired(1e12, DAY, 0.0, StateDoc(state=state))
    cancelled = StateDoc(state=JobState.CANCELLED, finished_unix_s=None)  # its start counts
    assert expired(500.0 + DAY, DAY, 500.0, cancelled)
    assert not expired(500.0 + ORPHAN_AFTER_S - 1, DAY, 500.0, None)  # a submit under way
    assert expired(500.0 + ORPHAN_AFTER_S, DAY, 500.0, None)  # its node died: left
    assert created_unix_s(new_id(1_800_000_000.5)) == 1_800_000_000.5


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _job(board: JobBoard) -> str:
    spec = JobSpec(new_id(board.clock()), "echo", "v-1", 3, 2, board.clock())
    board.create(spec, [{"x": np.full((1, 2), i, np.float32)} for i in range(3)])
    return spec.id


def test_a_sweep_removes_what_expired_and_keeps_the_rest(tmp_path: Path) -> None:
    store, clock = FileStore(tmp_path / "store"), Clock()
    board = JobBoard(store, "a", clock)
    old = _job(board)
    board.cancel(old)  # ended at the clock's now
    orphan = new_id(clock())
    board.write_chunks(orphan, iter([{"x": np.zeros((1, 2), np.float32)}]), 2)  # never queued
    clock.now += 2 * DAY
    recent = _job(board)
    board.cancel(recent)
    running = _job(board)
    fresh_orphan = new_id(clock())
    board.write_chunks(fresh_orphan, iter([{"x": np.zeros((1, 2), np.float32)}]), 2)
    removed, after = sweep_page(board, clock(), DAY)
    assert sorted(removed) == sorted([old, orphan]) and after is None
    left = {key.split("/")[1] for key in store.list("jobs/")}
    assert left == {recent, running, fresh_orphan}
    with pytest.raises(JobNotFound):
        board.status(old)
    assert board.status(running).state.state is JobState.QUEUED
    assert store.list(f"jobqueue/{old}") == []
    assert sweep_page(board, clock(), 0.0)[0] == []  # 0: every ended job kept


def test_a_sweep_goes_a_page_at_a_time(tmp_path: Path) -> None:
    store, clock = FileStore(tmp_path / "store"), Clock()
    board = JobBoard(store, "a", clock)
    jobs = []
    for _ in range(SWEEP_PAGE + 3):
        jobs.append(_job(board))
        board.cancel(jobs[-1])
        clock.now += 0.001
    clock.now += 2 * DAY
    first, after = sweep_page(board, clock(), DAY)
    assert len(first) == SWEEP_PAGE and after == jobs[SWEEP_PAGE - 1]
    rest, after = sweep_page(board, clock(), DAY, after)
    assert len(rest) == 3 and after is None
    assert store.list("jobs/") == []


def test_an_ended_jobs_state_is_read_once_and_young_jobs_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per sweep, the store is read for what may have changed: an ended job's state once
    (then its expiry is remembered), and no job too young to have expired."""
    store, clock = FileStore(tmp_path / "store"), Clock()
    board = JobBoard(store, "a", clock)
    ended = _job(board)
    board.cancel(ended)
    clock.now += 2 * DAY + 10
    young = _job(board)
    reads: list[str] = []
    state = board.state

    def counted(job: str) -> tuple[StateDoc, str]:
        reads.append(job)
        return state(job)

    monkeypatch.setattr(board, "state", counted)
    known: dict[str, float] = {}
    assert sweep_page(board, clock(), 3 * DAY, known=known) == ([], None)
    assert reads == [ended] and known == {ended: 1_000_000.0 + 3 * DAY}
    assert sweep_page(board, clock(), 3 * DAY, known=known) == ([], None)
    assert reads == [ended]  # remembered: not read again, and the young one never
    clock.now += DAY - 5  # the ended one's retention is over; the young is younger still
    assert sweep_page(board, clock(), 3 * DAY, known=known)[0] == [ended]
    assert known == {} and young not in reads


def test_a_job_that_cannot_be_read_is_passed_and_the_rest_still_go(tmp_path: Path) -> None:
    store, clock = FileStore(tmp_path / "store"), Clock()
    board = JobBoard(store, "a", clock)
    jobs = []
    for _ in range(3):
        jobs.append(_job(board))
        board.cancel(jobs[-1])
        clock.now += 1
    store.put(f"jobs/{jobs[1]}/state.json", b'{"state": "from a later version"}')
    clock.now += 2 * DAY
    removed, _ = sweep_page(board, clock(), DAY)
    assert removed == [jobs[0], jobs[2]]
    assert {key.split("/")[1] for key in store.list("jobs/")} == {jobs[1]}


def test_the_expiries_kept_are_bounded_and_those_due_are_dropped_after_a_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, clock = FileStore(tmp_path / "store"), Clock()
    board = JobBoard(store, "a", clock)
    monkeypatch.setattr(retention, "KNOWN_KEPT", 2)
    jobs = []
    for _ in range(3):
        jobs.append(_job(board))
        board.cancel(jobs[-1])
        clock.now += 1
    clock.now += 2 * DAY
    sweeper = Retention(board, 3 * DAY, 600.0)
    assert asyncio.run(sweeper.sweep()) == 0
    known = sweeper.expiries
    assert list(known) == jobs[:2]  # full: the third is read again next time
    for job in jobs[:2]:  # another node removed them
        board.discard(job)
    clock.now += DAY
    assert asyncio.run(sweeper.sweep()) == 1  # the third, read and removed
    assert known == {}  # the two due ones, removed elsewhere, dropped


def test_a_results_read_while_its_job_is_removed_ends_with_an_error(tmp_path: Path) -> None:
    """A cancelled job's chunk that never ran reads as "not run"; once the job is being
    removed (its state gone first), a missing chunk is an error, never made up."""
    from fnrt.functions.errors import StoreError
    from fnrt.runtime.http.jobs import _chunk_or_none

    store, clock = FileStore(tmp_path / "store"), Clock()
    board = JobBoard(store, "a", clock)
    job = _job(board)
    status = board.cancel(job)
    assert _chunk_or_none(board, status, 0) is None  # never ran: said so
    board.discard(job)
    with pytest.raises(StoreError, match="gone from the store"):
        _chunk_or_none(board, status, 0)
