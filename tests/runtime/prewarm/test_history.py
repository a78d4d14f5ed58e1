from __future__ import annotations

import json

from fnrt.runtime.prewarm.history import MINUTES_PER_DAY, History, HistoryConfig


def test_idle_times_fill_the_histogram() -> None:
    h = History(HistoryConfig(range_min=10))
    assert h.record_run(100, 102, 5) is None  # the first run has no idle time before it
    assert h.record_run(106, 106, 1) == 3  # minutes 103, 104, 105 were quiet
    assert h.record(107) == 0  # right after: an idle time of 0
    assert h.record(130) == 22  # beyond the 10-minute range
    assert h.bins[3] == 1 and h.bins[0] == 1 and h.out_of_range == 1
    assert h.samples == 3 and h.nonzero == [0, 3]
    assert list(h.recent_idle) == [3, 0, 22]
    assert h.invocations == 8 and h.last_minute == 130
    assert h.record(130) is None  # the same minute again: no idle time
    assert h.invocations == 9


def test_days_remember_the_time_of_day() -> None:
    h = History(HistoryConfig(days=3))
    for day in range(4):
        h.record(day * MINUTES_PER_DAY + 540)  # 9:00 every day
    assert h.called_on_days(540) == 3  # only the last 3 days are kept
    assert h.called_on_days(541) == 0
    assert h.days_seen == 3


def test_the_rate_rises_and_falls() -> None:
    h = History()
    for minute in range(60):
        h.record(minute, 1 + minute)  # more calls every minute
    assert h.rate_per_min > 20 and h.slope_per_min > 0.5
    for minute in range(60, 120):
        h.record(minute, 1)
    assert h.slope_per_min < 0


def test_it_round_trips_through_json_and_stays_small() -> None:
    h = History()
    for minute in range(0, 3 * MINUTES_PER_DAY, 7):
        h.record(minute, 2)
    data = json.loads(json.dumps(h.to_dict()))
    again = History.from_dict(data)
    assert again.bins == h.bins and again.nonzero == h.nonzero
    assert (again.in_range, again.square_sum, again.out_of_range) == (
        h.in_range,
        h.square_sum,
        h.out_of_range,
    )
    assert list(again.day_bits) == list(h.day_bits) and again.last_minute == h.last_minute
    assert again.first_day == h.first_day and again.invocations == h.invocations
    assert len(json.dumps(h.to_dict())) < 64 * 1024


def test_a_copy_goes_its_own_way() -> None:
    history = History(HistoryConfig(range_min=60, recent_idle=4))
    for minute in (0, 5, 12):
        history.record(minute)
    twin = history.copy()
    assert twin.to_dict() == history.to_dict() and twin.config == history.config
    for minute in (20, 30, 30 + MINUTES_PER_DAY):  # idle times, bins, a new day's bits
        history.record(minute)
    assert twin.to_dict() != history.to_dict()
    assert twin.to_dict() == History.from_dict(json.loads(json.dumps(twin.to_dict()))).to_dict()
    assert (twin.invocations, list(twin.recent_idle), twin.recent_idle.maxlen) == (3, [4, 6], 4)
