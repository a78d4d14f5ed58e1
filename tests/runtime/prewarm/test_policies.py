"""Each policy's decisions on constructed histories (the clock is the minute passed in)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fnrt.runtime.prewarm.history import MINUTES_PER_DAY, History
from fnrt.runtime.prewarm.policies import (
    Plan,
    Policy,
    PolicyConfig,
    Window,
    auto,
    best_window,
    decide,
    filling,
    representative,
    scarce,
)

CONFIG = PolicyConfig()


def periodic(period: int, calls: int, start: int = 0) -> History:
    h = History()
    for i in range(calls):
        h.record(start + i * period)
    return h


def test_plans_say_when_a_call_is_warm() -> None:
    keep = Plan(0, 10)
    assert [keep.warm(d) for d in (1, 10, 11)] == [True, True, False]
    assert keep.idle_loaded_min(4) == 3 and keep.idle_loaded_min(50) == 10
    ahead = Plan(28, 5)  # loaded for minutes 28..32 after the call
    assert [ahead.warm(d) for d in (1, 27, 28, 32, 33)] == [False, False, True, True, False]
    assert ahead.idle_loaded_min(30) == 2 and ahead.idle_loaded_min(10) == 0


def test_fixed_keeps_it_loaded() -> None:
    assert decide(Policy.FIXED, PolicyConfig(keep_alive_min=7), History(), 0) == Plan(
        0, 7, why="fixed"
    )


def test_histogram_prewarms_a_periodic_function_just_in_time() -> None:
    h = periodic(30, 40)  # idle 29 minutes, every time
    plan = decide(Policy.HISTOGRAM, CONFIG, h, 39 * 30)
    assert plan.why == "histogram" and plan.prewarm_after_min > 0
    assert plan.warm(30)  # the next call finds it loaded
    assert plan.idle_loaded_min(30) < 10  # and it idled less than a fixed 10 minutes would
    assert not plan.warm(5)  # unloaded right after the call


def test_histogram_keeps_a_busy_function_loaded() -> None:
    h = periodic(2, 100)  # idle 1 minute
    plan = decide(Policy.HISTOGRAM, CONFIG, h, 198)
    assert plan.prewarm_after_min == 0 and plan.warm(1) and plan.warm(2)


def test_histogram_falls_back_when_not_representative() -> None:
    few = periodic(30, 3)
    assert representative(CONFIG, few) == "too few idle times"
    assert decide(Policy.HISTOGRAM, CONFIG, few, 60).why == "fixed: too few idle times"
    flat = History()
    minute = 0
    for idle in range(0, 240, 3):  # idle times spread evenly over the range
        minute += idle + 1
        flat.record(minute)
    assert representative(CONFIG, flat) == "histogram too flat"
    assert decide(Policy.HISTOGRAM, CONFIG, flat, minute).prewarm_after_min == 0


def test_idle_times_beyond_the_range_are_forecast() -> None:
    h = periodic(600, 10)  # idle 599 minutes: past the 4-hour histogram
    plan = decide(Policy.HISTOGRAM, CONFIG, h, 5400)
    assert plan.why == "forecast"
    assert plan.warm(600) and not plan.warm(300)


def test_time_of_day_prewarms_before_a_daily_job() -> None:
    h = History()
    for day in range(3):
        h.record(day * MINUTES_PER_DAY + 540)  # 9:00
        h.record(day * MINUTES_PER_DAY + 1200)  # 20:00
    now = 3 * MINUTES_PER_DAY + 480  # 8:00 on day four
    h.record(now)
    plan = decide(Policy.TIME_OF_DAY, CONFIG, h, now)
    assert plan.why == "time of day" and plan.warm(60) and not plan.warm(30)
    assert plan.idle_loaded_min(60) <= 1  # loaded a minute before 9:00
    one_day = periodic(MINUTES_PER_DAY, 1, start=540)
    assert decide(Policy.TIME_OF_DAY, CONFIG, one_day, 540).why == "fixed"


def test_trend_warms_more_instances_while_the_rate_climbs() -> None:
    h = History()
    for minute in range(30):
        h.record(minute, 1 + 3 * minute)
    plan = decide(Policy.TREND, CONFIG, h, 29)
    assert plan.instances > 1 and plan.why == "trend"
    flat = periodic(1, 30)
    assert decide(Policy.TREND, CONFIG, flat, 29).instances == 1


def test_best_window_is_the_cheapest_of_all_windows() -> None:
    rng = np.random.default_rng(5)
    for _ in range(200):
        counts = np.zeros(52)
        where = rng.integers(1, 51, size=int(rng.integers(1, 8)))
        counts[where] = rng.integers(1, 20, size=len(where))
        if rng.random() < 0.5:
            counts[2:51] += rng.random() * np.linspace(1, 0.1, 49)  # a smooth prior
        beyond = float(rng.integers(0, 4))
        m, c = float(rng.uniform(0.05, 4)), float(rng.uniform(0, 100))
        found = best_window(counts, beyond, m, c)
        d = np.arange(len(counts))
        total = counts.sum() + beyond
        costs = [c * total]  # nothing loaded
        for a in range(1, 51):
            for b in range(a, 51):
                plan = Window(a, b, 0).plan("")
                idle = (counts * plan.idle_loaded_many(d)).sum() + beyond * (b - a + 1)
                cold = (counts * ~plan.warm_many(d)).sum() + beyond
                costs.append(m * idle + c * cold)
        assert found.cost * total == pytest.approx(min(costs), rel=1e-9, abs=1e-9)


def test_auto_weighs_memory_against_the_price_of_a_cold_start() -> None:
    h = periodic(30, 10)
    small = decide(Policy.AUTO, CONFIG, h, 270, memory_gb=0.1)
    assert small.prewarm_after_min == 0 and small.warm(30)  # cheap to keep: kept
    large = decide(Policy.AUTO, CONFIG, h, 270, memory_gb=4.0)
    assert large.loaded == (30, 30)  # dear to keep: unloaded, back for the call
    assert large.why == "cost"
    free = decide(Policy.AUTO, replace(CONFIG, cold_start_price_gb_s=0.0), h, 270, memory_gb=1)
    assert free == Plan(0, 0, why="cost")  # a cold start costs nothing: never loaded idle
    dear = decide(Policy.AUTO, replace(CONFIG, cold_start_price_gb_s=1e7), h, 270, memory_gb=4)
    assert dear.loaded == (1, 240)  # worth any memory: loaded across the whole range


def test_a_price_in_seconds_is_memory_blind() -> None:
    ten_minutes = PolicyConfig(cold_start_price_s=600)
    h = periodic(30, 10)
    plans = {decide(Policy.AUTO, ten_minutes, h, 270, memory_gb=m) for m in (0.1, 1, 16)}
    assert plans == {Plan(30, 1, why="cost")}  # 29 idle minutes cost more than 10


def test_a_short_history_does_not_decide_alone() -> None:
    short, long = periodic(30, 3), periodic(30, 40)
    planned = [decide(Policy.AUTO, CONFIG, h, h.last_minute or 0, 0.5) for h in (short, long)]
    assert all(p.warm(30) for p in planned)
    # two idle times of 30 minutes do not yet say the next is 30 minutes away
    assert planned[0].loaded[0] < planned[1].loaded[0]
    # called once: the prior alone, a keep-alive that shrinks as the instance grows
    once = periodic(30, 1)
    kept = [decide(Policy.AUTO, CONFIG, once, 0, m).keep_alive_min for m in (0.1, 1, 4, 32)]
    assert kept == sorted(kept, reverse=True) and kept[0] == 240 and kept[-1] == 0
    unpriced = decide(Policy.AUTO, replace(CONFIG, prior_weight=0), once, 0)
    assert unpriced.why == "fixed: too few idle times"  # no prior: the manifest's keep_alive_s


def test_auto_forecasts_idle_times_past_the_histogram() -> None:
    plan = decide(Policy.AUTO, CONFIG, periodic(600, 10), 5400, memory_gb=1.0)
    assert plan.why == "forecast" and plan.warm(600) and not plan.warm(300)


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="head_percentile"):
        PolicyConfig(head_percentile=99, tail_percentile=5)
    with pytest.raises(ValueError, match="cold_start_price"):
        PolicyConfig(cold_start_price_gb_s=-1)


def test_a_node_that_fills_its_budget_plans_at_a_higher_price_as_the_simulator_does(
    tmp_path: Path,
) -> None:
    from fnrt.runtime.node import build_node
    from fnrt.runtime.prewarm.policies import FILL_PRICE_FACTOR, filling
    from support import node_settings

    base = PolicyConfig(mean_instance_gb=2.0)
    for config in (base, replace(base, cold_start_price_gb_s=900.0)):
        assert filling(config).cold_start_gb_min(0.5) == pytest.approx(
            FILL_PRICE_FACTOR * config.cold_start_gb_min(0.5)
        )
    own = replace(base, cold_start_price_s=600.0, price_factor=2.0)
    assert own.cold_start_gb_min(0.5) == pytest.approx(2 * 600 / 60 * 0.5)
    with pytest.raises(ValueError, match="price_factor"):
        PolicyConfig(price_factor=0)
    built = {
        fill: build_node(node_settings(tmp_path / str(fill), fill_memory=fill))
        for fill in (True, False, None)
    }
    for fill, node in built.items():  # the plans decide the price: the node's is plain
        assert node.sweeper.keeper is not None and node.sweeper.keeper.config.price_factor == 1
        # by default, none under the default budget (a share of physical memory)
        assert node.sweeper.keeper.fill_memory is (fill or False)
    given = build_node(node_settings(tmp_path / "given", memory_budget_bytes=2**30))
    assert given.sweeper.keeper is not None and given.sweeper.keeper.fill_memory is None


def test_a_plan_fills_the_budget_while_what_fixed_keep_alive_holds_fits_it() -> None:
    from fnrt.runtime.prewarm.policies import FILL_SHARE, fills

    assert fills(3 * 2**30, 4 * 2**30) and fills(4 * 2**30, 4 * 2**30)
    assert not fills(5 * 2**30, 4 * 2**30)
    assert not fills(0, None)  # no budget: nothing to fill
    assert FILL_SHARE == 1.0


def test_a_plan_short_of_memory_is_priced_at_the_share_of_the_working_set_the_budget_holds() -> (
    None
):
    config = PolicyConfig(mean_instance_gb=1.0)
    gb = 2**30
    assert scarce(config, 2 * gb, None) is config  # no budget
    assert scarce(config, 2 * gb, 2 * gb) is config  # the working set fits
    assert scarce(config, 4 * gb, gb).price_factor == pytest.approx(0.25)
    assert scarce(filling(config), 4 * gb, gb).price_factor == pytest.approx(1.0)  # 4x, x0.25
    # a small function called every 5 minutes, every fifth time after 3: at the price it
    # is loaded from 3 minutes after a call for hours; when the budget holds a twentieth of
    # the working set, only for the minutes its calls come in
    h = History()
    minute = 0
    for i in range(200):
        h.record(minute)
        minute += 3 if i % 5 == 0 else 5
    plain = auto(config, h, minute, 0.125)
    short = auto(scarce(config, 20 * gb, gb), h, minute, 0.125)
    assert plain.loaded == (3, 240) and short.loaded == (3, 5)
