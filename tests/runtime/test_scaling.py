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


from fnrt.functions.manifest import ScalingConfig  # noqa: E402
from fnrt.runtime.scaling import should_add_instance  # noqa: E402

TWO = ScalingConfig(max_instances=2, scale_up_after_ms=200)


def test_adds_an_instance_when_the_queue_stays_deep() -> None:
    args = dict(instances=1, loading=False, queued=8, batch_size=8)
    assert not should_add_instance(TWO, **args, deep_since_s=10.0, now=10.1)  # type: ignore[arg-type]
    assert should_add_instance(TWO, **args, deep_since_s=10.0, now=10.25)  # type: ignore[arg-type]
    assert not should_add_instance(TWO, **{**args, "queued": 7}, deep_since_s=10.0, now=11)  # type: ignore[arg-type]
    assert not should_add_instance(TWO, **{**args, "loading": True}, deep_since_s=10.0, now=11)  # type: ignore[arg-type]
    assert not should_add_instance(TWO, **{**args, "instances": 2}, deep_since_s=10.0, now=11)  # type: ignore[arg-type]


def test_fills_up_to_min_instances() -> None:
    cfg = ScalingConfig(min_instances=2, max_instances=3)
    assert should_add_instance(
        cfg, instances=1, loading=False, queued=0, batch_size=8, deep_since_s=None, now=0
    )
