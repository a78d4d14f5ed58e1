"""Retries within a deadline (loader/retry.py), with a manual clock."""

from __future__ import annotations

import pytest

from fnrt.loader.retry import Deadline, RetryPolicy, may_retry, retrying


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_deadline_counts_from_the_last_progress_and_caps_the_whole() -> None:
    clock = Clock()
    deadline = Deadline(10.0, total_s=25.0, clock=clock)
    clock.now = 8.0
    assert deadline.left_s() == 2.0
    deadline.progressed()  # bytes arrived
    assert deadline.left_s() == 10.0
    clock.now = 20.0
    deadline.progressed()
    assert deadline.left_s() == 5.0  # the whole download's bound comes first


def test_no_retry_starts_that_could_only_fail_past_the_deadline() -> None:
    assert may_retry(left_s=10.0, wait_s=1.0, attempt_s=7.0)
    assert not may_retry(left_s=7.5, wait_s=1.0, attempt_s=7.0)
    clock = Clock()
    deadline = Deadline(15.0, clock=clock)
    tries: list[float] = []

    def hang() -> None:  # each attempt fails after a read timeout of 5 s
        tries.append(clock.now)
        clock.now += 5.0
        raise TimeoutError()

    def sleep(s: float) -> None:
        clock.now += s

    with pytest.raises(TimeoutError):
        retrying(
            hang,
            policy=RetryPolicy(max_attempts=10, base_delay_s=0.0, max_delay_s=0.0),
            transient=lambda _: True,
            sleep=sleep,
            deadline=deadline,
            attempt_s=7.0,
        )
    assert tries == [0.0, 5.0]  # a third would start at 10 s and could end at 17 s
    assert clock.now <= 15.0
