from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from fnrt.runtime.queue import Call, Priority, RequestQueue


def pending(
    loop: asyncio.AbstractEventLoop,
    name: str,
    at: float,
    priority: Priority,
    deadline: float | None = None,
) -> Call:
    return Call({"name": name}, loop.create_future(), at, priority, deadline)  # type: ignore[dict-item]


def names(batch: list[Call]) -> list[str]:
    return [p.inputs["name"] for p in batch]  # type: ignore[misc]


def test_high_first_then_normal_then_low_fifo_within_class() -> None:
    loop = asyncio.new_event_loop()
    q = RequestQueue(aging_s=10)
    for i, prio in enumerate(
        [Priority.LOW, Priority.NORMAL, Priority.LOW, Priority.HIGH, Priority.NORMAL]
    ):
        q.push(pending(loop, f"{prio.name.lower()}{i}", i * 0.001, prio))
    assert names(q.take(10, now=0.01).batch) == ["high3", "normal1", "normal4", "low0", "low2"]
    loop.close()


def test_high_never_waits_behind_a_backlog_of_low() -> None:
    loop = asyncio.new_event_loop()
    q = RequestQueue(aging_s=1.0)
    for i in range(100):
        q.push(pending(loop, f"low{i}", 0.0, Priority.LOW))
    q.push(pending(loop, "high", 0.5, Priority.HIGH))
    assert names(q.take(1, now=0.5).batch) == ["high"]
    loop.close()


def test_waiting_low_requests_age_into_higher_classes() -> None:
    loop = asyncio.new_event_loop()
    q = RequestQueue(aging_s=1.0)
    q.push(pending(loop, "old-low", 0.0, Priority.LOW))
    q.push(pending(loop, "new-normal", 1.5, Priority.NORMAL))
    q.push(pending(loop, "new-high", 2.05, Priority.HIGH))
    # at 2.1 s the low one has waited two aging periods: it counts as high and is older
    assert names(q.take(3, now=2.1).batch) == ["old-low", "new-high", "new-normal"]
    loop.close()


def test_take_drops_gone_clients_and_returns_expired() -> None:
    loop = asyncio.new_event_loop()
    q = RequestQueue(aging_s=1.0)
    gone = pending(loop, "gone", 0.0, Priority.NORMAL)
    gone.future.cancel()
    q.push(gone)
    q.push(pending(loop, "late", 0.0, Priority.NORMAL, deadline=0.05))
    q.push(pending(loop, "ok", 0.0, Priority.NORMAL, deadline=1.0))
    taken = q.take(10, now=0.1)
    assert names(taken.batch) == ["ok"] and names(taken.expired) == ["late"]
    assert taken.batch[0].started and len(q) == 0 and taken.removed == 3
    loop.close()


def test_take_sets_aside_requests_whose_client_disconnected() -> None:
    loop = asyncio.new_event_loop()
    q = RequestQueue(aging_s=1.0)
    left, stays = (
        pending(loop, "left", 0.0, Priority.NORMAL),
        pending(loop, "stays", 0.0, Priority.NORMAL),
    )
    left.client, stays.client = (
        SimpleNamespace(disconnected=True),
        SimpleNamespace(disconnected=False),
    )
    q.push(left)
    q.push(stays)
    taken = q.take(1, now=0.0)  # the one that left does not take a place in the batch
    assert names(taken.batch) == ["stays"] and names(taken.abandoned) == ["left"]
    assert not left.started and taken.removed == 2
    loop.close()


def test_job_records_never_age_and_fill_what_live_requests_leave() -> None:
    loop = asyncio.new_event_loop()
    q = RequestQueue(aging_s=1.0)
    for i in range(3):
        q.push(pending(loop, f"job{i}", 0.0, Priority.JOB))
    q.push(pending(loop, "low", 100.0, Priority.LOW))
    q.push(pending(loop, "normal", 100.0, Priority.NORMAL))
    # a hundred aging periods later the job records still come after every live class
    assert names(q.take(4, now=100.0).batch) == ["normal", "low", "job0", "job1"]
    assert q.depth_by_priority() == {"high": 0, "normal": 0, "low": 0, "job": 1}
    loop.close()


def test_a_record_alone_gets_a_batch_of_its_own() -> None:
    loop = asyncio.new_event_loop()
    q = RequestQueue(aging_s=1.0)
    q.push(pending(loop, "a", 0.0, Priority.JOB))
    alone = pending(loop, "alone", 0.1, Priority.JOB)
    alone.alone = True
    q.push(alone)
    q.push(pending(loop, "b", 0.2, Priority.JOB))
    first = q.take(8, now=1.0)
    assert names(first.batch) == ["a"] and first.removed == 1
    assert len(q) == 2
    assert names(q.take(8, now=1.0).batch) == ["alone"]
    assert names(q.take(8, now=1.0).batch) == ["b"]
    loop.close()


def test_clients_cannot_ask_for_the_job_class() -> None:
    assert Priority.parse(" Low ") is Priority.LOW
    with pytest.raises(ValueError, match="not high, normal or low"):
        Priority.parse("job")


def test_earliest_deadline_looks_at_what_a_take_of_that_size_may_remove() -> None:
    loop = asyncio.new_event_loop()
    q = RequestQueue(aging_s=1.0)
    assert q.earliest_deadline(4) is None
    q.push(pending(loop, "a", 0.0, Priority.NORMAL))
    q.push(pending(loop, "b", 0.0, Priority.NORMAL, deadline=5.0))
    q.push(pending(loop, "c", 0.0, Priority.NORMAL, deadline=2.0))  # third in its class
    q.push(pending(loop, "h", 0.0, Priority.HIGH, deadline=3.0))
    assert q.earliest_deadline(1) == 3.0  # the heads of each class
    assert q.earliest_deadline(2) == 3.0
    assert q.earliest_deadline(3) == 2.0
    loop.close()
