"""Instance counts: pure decisions on when to add one and when to drop one."""

from __future__ import annotations

from dataclasses import dataclass

from fnrt.functions.manifest import ScalingConfig


@dataclass(frozen=True)
class Activity:
    """What one instance slot reports."""

    loaded: bool
    busy: bool  # a batch is running or a load is under way
    queued: int  # requests waiting for the function
    last_active_s: float  # clock time it last finished work (or loaded)


def should_unload(keep_alive_s: float, activity: Activity, now: float) -> bool:
    """True when a loaded, idle instance has had no work for ``keep_alive_s``."""
    if not activity.loaded or activity.busy or activity.queued:
        return False
    return now - activity.last_active_s >= keep_alive_s


def should_add_instance(
    config: ScalingConfig,
    *,
    instances: int,
    loading: bool,
    queued: int,
    batch_size: int,
    deep_since_s: float | None,
    now: float,
) -> bool:
    """Start another instance when the queue has held a full batch for ``scale_up_after_ms``.

    Also when fewer than ``min_instances`` exist. One load at a time.
    """
    if loading or instances >= config.max_instances:
        return False
    if instances < config.min_instances:
        return True
    if queued < batch_size or deep_since_s is None:
        return False
    return now - deep_since_s >= config.scale_up_after_ms / 1000.0
