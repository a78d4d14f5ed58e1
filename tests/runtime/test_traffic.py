from __future__ import annotations

import random
from collections import Counter

import pytest

from fnrt.functions.manifest import RolloutConfig
from fnrt.runtime.outcomes import Summary
from fnrt.runtime.traffic import (
    BUCKETS,
    Verdict,
    bucket_of,
    canary_traffic,
    choose_version,
    judge_canary,
)


def test_shares_split_the_buckets() -> None:
    traffic = {"v-a": 90, "v-b": 10}
    counts = Counter(choose_version(traffic, b) for b in range(BUCKETS))
    assert counts == {"v-a": 9000, "v-b": 1000}


def test_a_single_version_takes_every_bucket_and_zero_shares_none() -> None:
    assert {choose_version({"v-a": 100, "v-b": 0}, b) for b in range(0, BUCKETS, 7)} == {"v-a"}


def test_random_draws_follow_the_shares() -> None:
    rng = random.Random(7)
    counts = Counter(
        choose_version({"v-a": 50, "v-b": 50}, bucket_of(None, rng)) for _ in range(4000)
    )
    assert 1800 < counts["v-a"] < 2200


@pytest.mark.parametrize("order", [("v-a", "v-b"), ("v-z", "v-b")])
def test_a_sticky_key_keeps_its_version_while_the_canary_grows(order: tuple[str, str]) -> None:
    base, new = order
    keys = [f"user-{i}" for i in range(500)]
    on_new_before = set()
    for percent in (10, 50, 90):
        traffic = canary_traffic(base, new, percent)
        on_new = {k for k in keys if choose_version(traffic, bucket_of(k)) == new}
        assert on_new_before <= on_new  # nobody moves back to the old version
        assert abs(len(on_new) / len(keys) - percent / 100) < 0.1
        on_new_before = on_new
    assert bucket_of("user-1") == bucket_of("user-1")


def test_canary_traffic() -> None:
    assert canary_traffic("v-a", "v-b", 10) == {"v-a": 90, "v-b": 10}
    assert canary_traffic("v-a", "v-b", 100) == {"v-b": 100}


CONFIG = RolloutConfig(
    policy="canary", dwell_s=10, min_requests=20, max_error_rate=0.05, max_p99_ratio=2.0
)
GOOD = Summary(100, 0, 0.010)


def test_canary_holds_then_advances_after_the_dwell() -> None:
    assert judge_canary(CONFIG, GOOD, GOOD, 100.0, 105.0).verdict is Verdict.HOLD
    assert judge_canary(CONFIG, GOOD, GOOD, 100.0, 110.0).verdict is Verdict.ADVANCE


def test_canary_rolls_back_on_errors_over_the_baseline() -> None:
    bad = Summary(40, 4, 0.010)  # 10% against 0%
    judgement = judge_canary(CONFIG, GOOD, bad, 100.0, 101.0)
    assert judgement.verdict is Verdict.ROLL_BACK
    assert "error rate 10.0%" in judgement.reason
    # the same errors are allowed when the old version fails as often
    assert judge_canary(CONFIG, Summary(100, 10, 0.01), bad, 100.0, 101.0).verdict is Verdict.HOLD


def test_canary_is_not_judged_on_too_few_requests() -> None:
    assert judge_canary(CONFIG, GOOD, Summary(5, 5, 1.0), 100.0, 101.0).verdict is Verdict.HOLD


def test_canary_rolls_back_on_a_slow_p99() -> None:
    slow = Summary(100, 0, 0.030)  # 30 ms against 2 x 10 ms + 5 ms
    judgement = judge_canary(CONFIG, GOOD, slow, 100.0, 101.0)
    assert judgement.verdict is Verdict.ROLL_BACK and "p99 30.0 ms" in judgement.reason
    assert judge_canary(CONFIG, GOOD, Summary(100, 0, 0.024), 100.0, 101.0).verdict is Verdict.HOLD
    # no baseline to compare with: latency is not judged
    assert judge_canary(CONFIG, Summary(3, 0, 0.001), slow, 100.0, 101.0).verdict is Verdict.HOLD


def test_a_canary_whose_breaker_opened_is_rolled_back_whatever_its_outcomes() -> None:
    """The requests its open breaker refuses never reach its outcomes: a canary that
    kept dying has served few, all fine, and would be promoted after its dwell."""
    few = Summary(3, 0, 0.010)
    assert judge_canary(CONFIG, GOOD, few, 100.0, 110.0).verdict is Verdict.ADVANCE
    judged = judge_canary(CONFIG, GOOD, few, 100.0, 110.0, breaker_opened=1)
    assert judged.verdict is Verdict.ROLL_BACK and "circuit breaker opened" in judged.reason
