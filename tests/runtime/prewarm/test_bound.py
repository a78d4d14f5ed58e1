"""The floor of cold starts under a node's memory budget, and Belady's evictions."""

from __future__ import annotations

import pytest
from tracesupport import made

from fnrt.runtime.prewarm.bound import floor, strict_cold
from fnrt.runtime.prewarm.node import (
    CLAIRVOYANT,
    NODE_POLICIES,
    ORACLE,
    Cause,
    fixed_peak_gb,
    simulate_node,
)
from fnrt.runtime.prewarm.trace import synthetic


def test_the_floor_counts_first_calls_and_runs_that_cannot_fit_beside_the_busy() -> None:
    # a: busy from minute 10 to 20 (2 GB); b and c (1 GB each) start again at 15, in a
    # 3 GB node: beside a only one of them fits, whatever was kept or pre-warmed
    busy = list(range(10, 21))
    trace = made(
        {"a": busy, "b": [0, 15], "c": [1, 15], "d": [2, 40]},
        {"a": 2048, "b": 1024, "c": 1024, "d": 1024},
    )
    bounded = floor(trace, 3.0)
    assert (bounded.first_calls, bounded.over_budget) == (4, 1)
    assert bounded.cold_starts == 5
    assert bounded.busy_over_minutes == 1  # minute 15: a, b and c busy, 4 GB
    assert floor(trace, 4.0).over_budget == 0
    assert floor(trace, None).cold_starts == 4
    assert floor(trace, 1.5).busy_over_minutes == len(busy)
    with pytest.raises(ValueError, match="budget_gb"):
        floor(trace, 0)


def test_belady_evicts_the_one_called_furthest_ahead_which_lru_keeps() -> None:
    # 2 GB hold two of three 1 GB functions; at minute 6 c loads: LRU drops a (used
    # longest ago), though a is called again at 8 and b only at 30
    trace = made({"a": [0, 8], "b": [2, 30], "c": [6]}, {"a": 1024, "b": 1024, "c": 1024})
    assert simulate_node(trace, ORACLE, 2.0, record=True).order[0] == (6, "b")
    assert simulate_node(trace, "lru", 2.0, record=True).order[0] == (6, "a")
    assert simulate_node(trace, ORACLE, 2.0).cold_starts == 4  # a warm at 8
    assert simulate_node(trace, "lru", 2.0).cold_starts == 5


def test_no_policy_goes_below_the_floor() -> None:
    trace = synthetic(60, days=1, seed=5)
    peak = fixed_peak_gb(trace)
    for share in (0.25, 0.5, 1.0):
        bounded = floor(trace, share * peak).cold_starts
        for policy in (*NODE_POLICIES, ORACLE, CLAIRVOYANT):
            cold = simulate_node(trace, policy, share * peak).cold_starts
            assert cold >= bounded, (share, policy)


def test_the_floor_counts_what_leftovers_over_the_budget_can_serve() -> None:
    # 3 GB: b (2 GB), kept since minute 0, is busy at 10 when a (2 GB, busy 10-12) loads
    # cold: 4 GB, over the budget. b stays loaded as it goes idle (no load evicts it),
    # so its run at 12 is warm beside a, where a strict node has room for nothing
    trace = made({"b": [0, 10, 12], "a": [10, 11, 12]}, {"b": 2048, "a": 2048})
    bounded = floor(trace, 3.0)
    assert bounded.strict_cold_starts == 3  # first calls, and b at 12 beside a
    assert simulate_node(trace, "lru", 3.0).cold_starts == 2  # below the strict count
    assert bounded.cold_starts == 2 and bounded.over_budget_kept == 0
    # a first call between the two (c at 11) is a load: it evicts b, a leftover no more
    evicted = made(
        {"b": [0, 10, 12], "a": [10, 11, 12], "c": [11]}, {"b": 2048, "a": 2048, "c": 512}
    )
    assert floor(evicted, 3.0).over_budget_kept == 1
    assert simulate_node(evicted, "lru", 3.0).cold_starts == 4


def test_strict_cold_names_the_runs_the_oracle_cannot_serve_warm() -> None:
    # the trace of the first test: four first calls, and at 15 one of b and c (the
    # larger index among equal sizes: c) does not fit beside a
    trace = made(
        {"a": list(range(10, 21)), "b": [0, 15], "c": [1, 15], "d": [2, 40]},
        {"a": 2048, "b": 1024, "c": 1024, "d": 1024},
    )
    assert strict_cold(trace, 3.0) == {(10, 0), (0, 1), (1, 2), (2, 3), (15, 2)}
    day = synthetic(60, days=1, seed=5)
    peak = fixed_peak_gb(day)
    for share in (0.25, 0.5):
        assert len(strict_cold(day, share * peak)) == floor(day, share * peak).strict_cold_starts
    with pytest.raises(ValueError, match="budget_gb"):
        strict_cold(trace, 0)


def test_the_clairvoyant_planner_is_cold_only_where_memory_keeps_it_so() -> None:
    # no budget: each run pre-warmed in its minute, only first calls are cold, and no
    # memory is idle; the trace of the first test at 3 GB: the oracle's cold starts too
    trace = synthetic(40, days=1, seed=6)
    alone = simulate_node(trace, CLAIRVOYANT, None, record=True)
    assert alone.cold_starts == floor(trace, None).cold_starts
    assert alone.idle_gb_minutes == 0 and set(alone.causes) == {Cause.FIRST_CALL}
    small = made(
        {"a": list(range(10, 21)), "b": [0, 15], "c": [1, 15], "d": [2, 40]},
        {"a": 2048, "b": 1024, "c": 1024, "d": 1024},
    )
    assert simulate_node(small, CLAIRVOYANT, 3.0).cold_starts == floor(small, 3.0).cold_starts
