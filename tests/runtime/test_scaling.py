from __future__ import annotations

import pytest

from fnrt.runtime.scaling import Activity, should_unload

IDLE = Activity(loaded=True, busy=False, queued=0, last_active_s=100.0)


@pytest.mark.parametrize(
    ("activity", "now", "expected"),
    [
        (IDLE, 399.9, False),
        (IDLE, 400.0, True),
        (Activity(loaded=False, busy=False, queued=0, last_active_s=0), 1e9, False),
        (Activity(loaded=True, busy=True, queued=0, last_active_s=0), 1e9, False),
        (Activity(loaded=True, busy=False, queued=3, last_active_s=0), 1e9, False),
    ],
)
def test_should_unload(activity: Activity, now: float, expected: bool) -> None:
    assert should_unload(300, activity, now) is expected


def test_zero_keep_alive_unloads_as_soon_as_idle() -> None:
    assert should_unload(0, IDLE, 100.0)
