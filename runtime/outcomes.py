"""What happened to a version's recent requests: a time window of outcomes.

The canary judge reads error rates and latency percentiles over the span of
a rollout's step. Outcomes are kept only while a rollout watches the version
(:meth:`OutcomeWindow.watch`): the judge reads none from before its step
began, and the usual batch, with no rollout, pays one comparison for them (a
batch's entries appended to a full window, each pushing out one the cache had
long dropped, were about 1% of the event loop's time). Recording is an append
(the hot path); the figures are computed only when a decision asks for them.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from itertools import repeat


@dataclass(frozen=True)
class Summary:
    """Outcomes over a span: how many, how many failed, and the p99 latency."""

    requests: int
    errors: int
    p99_s: float

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def to_dict(self) -> dict[str, float]:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "error_rate": round(self.error_rate, 4),
            "p99_ms": round(self.p99_s * 1000, 3),
        }


EMPTY = Summary(0, 0, 0.0)


def p99(latencies_s: list[float]) -> float:
    """The 99th percentile (nearest rank) of ``latencies_s``; 0 when empty."""
    if not latencies_s:
        return 0.0
    ordered = sorted(latencies_s)
    return ordered[max(math.ceil(0.99 * len(ordered)) - 1, 0)]


class OutcomeWindow:
    """The newest outcomes (time, failed?, latency), at most ``max_items`` of them."""

    def __init__(self, max_items: int = 8192) -> None:
        self._items: deque[tuple[float, bool, float]] = deque(maxlen=max_items)
        self.watchers = 0  # the rollouts reading it: nothing is kept while none does

    def watch(self) -> None:
        """A reader begins: outcomes are kept from now on."""
        self.watchers += 1

    def unwatch(self) -> None:
        """A reader ends; with the last, what was kept goes."""
        self.watchers -= 1
        if not self.watchers:
            self._items.clear()

    def record(self, now: float, failed: bool, latency_s: float) -> None:
        if self.watchers:
            self._items.append((now, failed, latency_s))

    def successes(self, now: float, latencies_s: list[float]) -> None:
        """Requests served at ``now``, in these latencies (no Python frame an item)."""
        if self.watchers:
            self._items.extend(zip(repeat(now), repeat(False), latencies_s))

    def summary(self, since: float) -> Summary:
        """Outcomes recorded at or after ``since`` (a clock time)."""
        chosen = []
        for item in reversed(self._items):  # newest first; times only grow
            if item[0] < since:
                break
            chosen.append(item)
        if not chosen:
            return EMPTY
        errors = sum(1 for _, failed, _ in chosen if failed)
        return Summary(len(chosen), errors, p99([latency for _, _, latency in chosen]))

    def clear(self) -> None:
        self._items.clear()
