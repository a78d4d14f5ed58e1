"""Each policy's decisions on constructed histories (the clock is the minute passed in)."""

from __future__ import annotations

import pytest

from fnrt.runtime.prewarm.history import MINUTES_PER_DAY, History
from fnrt.runtime.prewarm.policies import Plan, Policy, PolicyConfig, decide, representative

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


@pytest.mark.parametrize(
    ("history", "why"),
    [
        (periodic(30, 40), "histogram"),
        (periodic(600, 10), "forecast"),
        (periodic(30, 2), "fixed: too few idle times"),
    ],
)
def test_auto_chooses_by_what_the_history_supports(history: History, why: str) -> None:
    assert decide(Policy.AUTO, CONFIG, history, history.last_minute or 0).why == why


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="head_percentile"):
        PolicyConfig(head_percentile=99, tail_percentile=5)
