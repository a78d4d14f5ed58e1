"""Scale to zero: a pure decision on whether an instance should be unloaded."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Activity:
    """What a function's scheduler reports about its instance."""

    loaded: bool
    busy: bool  # a batch is running or a load is under way
    queued: int
    last_active_s: float  # clock time the instance last finished work (or loaded)


def should_unload(keep_alive_s: float, activity: Activity, now: float) -> bool:
    """True when a loaded, idle instance has had no work for ``keep_alive_s``."""
    if not activity.loaded or activity.busy or activity.queued:
        return False
    return now - activity.last_active_s >= keep_alive_s
