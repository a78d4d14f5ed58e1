"""The pace of a transfer, judged per window of waiting (no clock, no sockets)."""

from __future__ import annotations

import pytest

from fnrt.runtime.http.pace import Meter, Pace

PACE = Pace(min_rate_bytes_s=500, window_s=2.0)


def test_a_trickle_is_too_slow_at_the_end_of_its_window() -> None:
    meter = Meter(100)  # 100 bytes came before this transfer
    moved = 100
    verdicts = []
    for _ in range(8):  # a byte every 0.25 s
        moved += 1
        verdicts.append(meter.wait(moved, 0.25, PACE))
    assert verdicts[:7] == [None] * 7  # the window is open
    assert verdicts[7] == pytest.approx(4.0)  # 8 bytes in 2 s


def test_a_transfer_at_pace_passes_window_after_window() -> None:
    meter = Meter()
    moved = 0
    for _ in range(40):  # 10 windows at 600 bytes/s
        moved += 150
        assert meter.wait(moved, 0.25, PACE) is None


def test_each_window_is_judged_alone() -> None:
    """A fast start buys no slack for a trickle after it."""
    meter = Meter()
    assert meter.wait(1_000_000, 2.0, PACE) is None  # a megabyte in the first window
    assert meter.wait(1_000_010, 2.0, PACE) == pytest.approx(5.0)  # then 10 bytes in 2 s


def test_no_minimum_judges_nothing() -> None:
    meter = Meter()
    off = Pace(min_rate_bytes_s=0, window_s=2.0)
    assert meter.wait(0, 10.0, off) is None
    assert meter.slow_rate(0, off) is None


def test_slow_so_far_only_after_the_grace() -> None:
    meter = Meter()
    meter.wait(1, 0.25, PACE)
    assert meter.slow_rate(1, PACE) is None  # 0.25 s: too soon to say
    meter.wait(2, 0.25, PACE)
    assert meter.slow_rate(2, PACE) == pytest.approx(4.0)
    fast = Meter()
    fast.wait(10_000, 0.5, PACE)
    assert fast.slow_rate(10_000, PACE) is None


def test_restart_forgets_the_last_transfer() -> None:
    meter = Meter()
    meter.wait(0, 1.5, PACE)
    meter.restart(50)
    assert meter.wait(50 + 1000, 1.0, PACE) is None  # a new window: 1 s of 2
    assert meter.wait(50 + 1000, 1.0, PACE) is None  # 1000 bytes in 2 s: at pace


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"min_rate_bytes_s": -1}, "min_rate_bytes_s"), ({"window_s": 0}, "window_s")],
)
def test_a_bad_pace_names_its_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Pace(**kwargs)
