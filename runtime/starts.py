"""What calls find when they arrive at one version, and whether its pre-warms were used.

A call finds a loaded instance (warm), one loaded ahead of it and not used yet
(pre-warmed: a hit, with how long ahead it loaded), or none (cold). A pre-warmed
instance dropped before any call used it is a miss. :class:`Starts` counts these
in the version's stats and tells them as events; the pool tells it when a
pre-warm begins and when its first instance is dropped, and reads nothing back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from fnrt.loader.instance import Runnable
from fnrt.runtime.events import Events, PrewarmOutcome, StartKind
from fnrt.runtime.stats import Stats


class Holder(Protocol):
    """A slot as the count reads it: whether it holds an instance."""

    instance: Runnable | None


class Starts:
    """The starts and pre-warm outcomes of one version's calls."""

    def __init__(self, name: str, slots: Sequence[Holder], stats: Stats, events: Events) -> None:
        self._name = name
        self._slots = slots  # the pool's, read only
        self._stats = stats
        self._events = events
        self._prewarmed_at: float | None = None  # a pre-warmed instance no call has used yet

    def count(self, now: float) -> StartKind:
        """What a call arriving now finds: a loaded instance, a pre-warmed one, or none."""
        loaded = False
        for slot in self._slots:  # no generator frame: this runs per request
            if slot.instance is not None:
                loaded = True
                break
        if not loaded:
            kind = StartKind.COLD
            self._prewarmed_at = None  # a pre-warm still loading: this call waits for it
        elif self._prewarmed_at is not None:
            kind = StartKind.PREWARMED
            self._stats.last_prewarm_lead_s = now - self._prewarmed_at
            self._prewarmed_at = None
            self._stats.prewarms[PrewarmOutcome.HIT] += 1
            self._events.prewarmed(self._name, PrewarmOutcome.HIT)
        else:
            kind = StartKind.WARM
        self._stats.starts[kind] += 1
        self._events.started(self._name, kind)
        return kind

    def prewarming(self, now: float) -> None:
        """A pre-warm's load begins at ``now`` (marked before it: a call may arrive in the
        turn between the instance being set and the pre-warm resuming, and it must count
        as pre-warmed)."""
        self._prewarmed_at = now

    def prewarm_failed(self) -> None:
        """The pre-warm's load failed: nothing was loaded ahead."""
        self._prewarmed_at = None

    def dropped(self) -> None:
        """The first instance was dropped: a miss if it was pre-warmed and never used."""
        if self._prewarmed_at is not None:
            self._prewarmed_at = None
            self._stats.prewarms[PrewarmOutcome.MISS] += 1
            self._events.prewarmed(self._name, PrewarmOutcome.MISS)
