"""What calls find when they arrive, and pre-warm hits and misses: slots as records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fnrt.runtime.events import NoEvents, PrewarmOutcome, StartKind
from fnrt.runtime.starts import Starts
from fnrt.runtime.stats import Stats


@dataclass
class Place:
    instance: Any = None


def test_calls_find_cold_warm_or_prewarmed_instances() -> None:
    slots, stats = [Place()], Stats()
    starts = Starts("f", slots, stats, NoEvents())
    assert starts.count(1.0) is StartKind.COLD
    slots[0].instance = object()
    assert starts.count(2.0) is StartKind.WARM
    slots[0].instance = None
    starts.prewarming(10.0)
    slots[0].instance = object()  # the pre-warm's load is done
    assert starts.count(14.0) is StartKind.PREWARMED  # the first call after it: a hit
    assert stats.last_prewarm_lead_s == 4.0
    assert starts.count(15.0) is StartKind.WARM
    assert stats.starts == {StartKind.COLD: 1, StartKind.WARM: 2, StartKind.PREWARMED: 1}
    assert stats.prewarms[PrewarmOutcome.HIT] == 1


def test_a_prewarm_no_call_used_is_a_miss_and_a_call_during_its_load_is_cold() -> None:
    slots, stats = [Place()], Stats()
    starts = Starts("f", slots, stats, NoEvents())
    starts.prewarming(1.0)
    assert starts.count(2.0) is StartKind.COLD  # still loading: this call waits for it
    slots[0].instance = object()
    assert starts.count(3.0) is StartKind.WARM  # not counted as a pre-warm's hit
    starts.prewarming(5.0)
    starts.dropped()  # unloaded before any call came
    assert stats.prewarms[PrewarmOutcome.MISS] == 1
    starts.dropped()
    assert stats.prewarms[PrewarmOutcome.MISS] == 1  # one miss per pre-warm
    starts.prewarming(6.0)
    starts.prewarm_failed()
    assert starts.count(7.0) is StartKind.WARM
