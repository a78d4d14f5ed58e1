"""The job board on a real folder store: two boards are two nodes sharing it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fnrt.functions.errors import BadRequest, Conflict
from fnrt.loader.stores import FileStore
from fnrt.runtime.jobs import board as board_module
from fnrt.runtime.jobs.board import (
    JobBoard,
    JobNotFound,
    JobSpec,
    JobState,
    Lease,
    final_state,
    is_id,
    lease_free,
    new_id,
    ok_outcome,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _board(store: FileStore, node: str, clock: Clock) -> JobBoard:
    return JobBoard(store, node, clock)


def _job(board: JobBoard, records: int = 25, chunk_records: int = 10) -> JobSpec:
    spec = JobSpec(new_id(board.clock()), "echo", "v-1", records, chunk_records, board.clock())
    rows = [{"x": np.full((1, 2), i, np.float32)} for i in range(records)]
    board.create(spec, rows)
    return spec


def _results(board: JobBoard, lease: Lease, scale: float = 2.0) -> list[dict[str, object]]:
    rows = board.chunk_inputs(lease.job, lease.chunk)
    return [ok_outcome({"y": r["x"] * scale}) for r in rows]


@pytest.fixture
def two(tmp_path: Path) -> tuple[JobBoard, JobBoard, Clock]:
    store, clock = FileStore(tmp_path / "store"), Clock()
    return _board(store, "a", clock), _board(store, "b", clock), clock


def test_ids_sort_by_age_and_are_checked() -> None:
    first, second = new_id(1000.0), new_id(1000.5)
    assert is_id(first) and is_id(second) and first < second
    assert not is_id("../../etc") and not is_id(first.upper())


def test_a_new_job_is_whole_before_it_is_queued(two: tuple[JobBoard, JobBoard, Clock]) -> None:
    a, b, _ = two
    spec = _job(a)
    assert b.queued() == [spec.id]
    assert b.spec(spec.id) == spec
    assert spec.chunks == 3 and spec.chunk_size(2) == 5
    status = b.status(spec.id)
    assert status.state.state is JobState.QUEUED
    assert (status.records_done, status.chunks_done) == (0, 0)
    np.testing.assert_array_equal(b.chunk_inputs(spec.id, 2)[0]["x"], [[20.0, 20.0]])


def test_one_node_holds_a_chunk_at_a_time(two: tuple[JobBoard, JobBoard, Clock]) -> None:
    a, b, _ = two
    spec = _job(a)
    taken = [a.claim(spec.id, 30), b.claim(spec.id, 30), a.claim(spec.id, 30)]
    assert [t.chunk for t in taken if t is not None] == [0, 1, 2]
    assert b.claim(spec.id, 30) is None  # every chunk held


def test_a_dead_nodes_chunk_is_taken_once_its_lease_runs_out(
    two: tuple[JobBoard, JobBoard, Clock],
) -> None:
    a, b, clock = two
    spec = _job(a, records=10)
    held = a.claim(spec.id, 30)
    assert held is not None and held.attempt == 1
    clock.now += 29
    assert b.claim(spec.id, 30) is None
    clock.now += 2
    again = b.claim(spec.id, 30)
    assert again is not None and (again.chunk, again.attempt, again.node) == (0, 2, "b")
    assert a.renew(held, 30) is None  # a came back: it learns it lost the chunk


def test_renewing_keeps_the_chunk(two: tuple[JobBoard, JobBoard, Clock]) -> None:
    a, b, clock = two
    spec = _job(a, records=10)
    held = a.claim(spec.id, 30)
    assert held is not None
    clock.now += 20
    renewed = a.renew(held, 30)
    assert renewed is not None
    clock.now += 20
    assert b.claim(spec.id, 30) is None


def test_a_chunk_run_twice_keeps_the_first_results_once(
    two: tuple[JobBoard, JobBoard, Clock],
) -> None:
    a, b, clock = two
    spec = _job(a, records=10)
    slow = a.claim(spec.id, 30)
    assert slow is not None
    clock.now += 31  # a stalls past its lease; b takes the chunk and finishes it
    fast = b.claim(spec.id, 30)
    assert fast is not None
    b.finish_chunk(fast, _results(b, fast, scale=2.0))
    done = a.finish_chunk(slow, _results(a, slow, scale=3.0))  # a's late results are dropped
    assert (done.records, done.failed) == (10, 0)
    results = a.chunk_results(spec.id, 0)
    assert len(results) == 10
    np.testing.assert_array_equal(results[4]["outputs"]["y"], [[8.0, 8.0]])
    assert a.status(spec.id).records_done == 10


def test_the_last_chunk_ends_the_job_once(two: tuple[JobBoard, JobBoard, Clock]) -> None:
    a, b, _ = two
    spec = _job(a, records=20)
    first, second = a.claim(spec.id, 30), b.claim(spec.id, 30)
    assert first is not None and second is not None
    a.mark_running(spec.id)
    a.finish_chunk(first, _results(a, first))
    assert a.complete(spec.id) is None  # one chunk left
    results = _results(b, second)
    results[3] = {"error": {"message": "bad input", "type": "HandlerFailed"}}
    b.finish_chunk(second, results)
    ended = b.complete(spec.id)
    assert ended is not None and ended.state.state is JobState.DONE
    assert (ended.records_done, ended.records_failed) == (20, 1)
    assert a.complete(spec.id) is None  # ended already: no second webhook
    assert a.queued() == []
    status = a.status(spec.id)
    assert status.state.started_unix_s is not None and status.state.finished_unix_s is not None


def test_cancel_takes_the_job_off_the_queue(two: tuple[JobBoard, JobBoard, Clock]) -> None:
    a, b, _ = two
    spec = _job(a)
    cancelled = b.cancel(spec.id)
    assert cancelled.state.state is JobState.CANCELLED
    assert a.queued() == []
    with pytest.raises(Conflict, match="already cancelled"):
        a.cancel(spec.id)
    with pytest.raises(JobNotFound):
        a.status("0" * 25)


def test_decisions() -> None:
    lease = Lease("j", 0, "a", until_unix_s=100.0, attempt=1)
    assert lease_free(None, 50.0) and not lease_free(lease, 99.9) and lease_free(lease, 100.0)
    assert final_state(10, 0) is JobState.DONE
    assert final_state(10, 9) is JobState.DONE
    assert final_state(10, 10) is JobState.FAILED


def test_a_chunk_given_back_says_why_and_a_stopping_node_costs_no_attempt(
    two: tuple[JobBoard, JobBoard, Clock],
) -> None:
    a, b, _ = two
    spec = _job(a, records=10)
    held = a.claim(spec.id, 30)
    assert held is not None
    a.release(held, "LoadError: no module named torch")
    again = b.claim(spec.id, 30)
    assert again is not None and again.attempt == 2
    assert again.reason == "LoadError: no module named torch"
    b.release(again, "its node stopped", counted=False)
    third = a.claim(spec.id, 30)
    assert third is not None and third.attempt == 2 and third.reason == "its node stopped"


def test_a_job_has_a_bounded_number_of_chunks(
    two: tuple[JobBoard, JobBoard, Clock], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _, _ = two
    monkeypatch.setattr(board_module, "MAX_CHUNKS", 3)
    rows = iter([{"x": np.zeros((1, 2), np.float32)}] * 7)
    with pytest.raises(BadRequest, match="at most 3 chunks"):
        a.write_chunks("0" * 25, rows, chunk_records=2)
    assert a.write_chunks("1" * 25, iter([{"x": np.zeros((1, 2))}] * 6), chunk_records=2) == 6


def test_a_chunk_of_records_each_within_the_limits_is_read_back_whole(
    two: tuple[JobBoard, JobBoard, Clock],
) -> None:
    """Each record was checked alone at the submit; a chunk stacks them (one more
    dimension, its records times the elements): read back past one request's limits."""
    a, _, _ = two
    deep = (1,) * 32  # the most dimensions one request's tensor may have
    spec = JobSpec(new_id(a.clock()), "echo", "v-1", 3, 3, a.clock())
    a.create(spec, [{"x": np.full(deep, i, np.float32)} for i in range(3)])
    records = a.chunk_inputs(spec.id, 0)
    assert [float(r["x"].ravel()[0]) for r in records] == [0.0, 1.0, 2.0]
    lease = a.claim(spec.id, 30)
    assert lease is not None
    a.finish_chunk(lease, [ok_outcome({"y": r["x"]}) for r in records])
    assert [r["outputs"]["y"].shape for r in a.chunk_results(spec.id, 0)] == [deep] * 3


def test_a_node_keeps_no_counts_of_jobs_that_ended(two: tuple[JobBoard, JobBoard, Clock]) -> None:
    a, b, _ = two
    for _ in range(3):
        spec = _job(a, records=4, chunk_records=2)
        while (lease := a.claim(spec.id, 30)) is not None:
            a.finish_chunk(lease, _results(a, lease))
        b.done_chunks(spec.id)  # another node looked at it while it ran
        assert a.complete(spec.id) is not None
        assert b.complete(spec.id) is None  # ended by a: nothing to do
    assert a.queued() == []
    assert len(a.done_counts) == len(b.done_counts) == 0  # the ended jobs' counts dropped
