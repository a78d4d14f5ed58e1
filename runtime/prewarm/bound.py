"""How few cold starts one node's memory allows at all: a floor under every policy.

:func:`floor` counts, for a trace on one node of ``budget_gb`` (the accounting of
:func:`~fnrt.runtime.prewarm.node.simulate_node`: one instance per function, at
minute granularity, a run of busy minutes never evicted), the cold starts no
keep-alive or pre-warm can avoid, even one that knows every call ahead:

- ``first_calls``: each function's first call (nothing can have been loaded for
  a function no call has named yet);
- ``over_budget``: the later runs that start in a minute when they cannot all
  be loaded beside the instances busy then. An oracle pre-warms each run's
  instance in the minute its call comes (it holds no idle memory for it), so a
  run is warm whenever it fits beside the runs busy in that minute, and the
  most that fit are the smallest; the rest are cold whatever the policy.

Pre-warming at the call's minute is the best any policy can do, so the floor
is the fewest cold starts with pre-warming allowed (a bound without pre-warms
would be higher). It holds for a node that keeps idle instances within its
budget; a node that went over the budget for busy instances keeps the idle ones
left over until its next load (as :func:`~fnrt.runtime.prewarm.node.
simulate_node` and the server do), which a policy could use, so
:func:`floor`'s ``over_budget`` is a bound for the strict node and a measure of
how much the budget, not the policy, decides on the lenient one. A goal of
``x`` times a peer's cold starts is out of reach when ``floor > x * peer``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from fnrt.runtime.prewarm.simulator import _instance_gb, _runs
from fnrt.runtime.prewarm.trace import Trace

GB = 2**30


@dataclass(frozen=True)
class Floor:
    """The cold starts no policy avoids on a node of ``budget_gb`` (None: unbounded)."""

    budget_gb: float | None
    first_calls: int
    over_budget: int
    busy_over_minutes: int  # minutes whose busy instances alone exceed the budget

    @property
    def cold_starts(self) -> int:
        return self.first_calls + self.over_budget


def floor(trace: Trace, budget_gb: float | None) -> Floor:
    """The floor of cold starts for ``trace`` on one node of ``budget_gb``."""
    if budget_gb is not None and not budget_gb > 0:
        raise ValueError("budget_gb: must be > 0")
    memory = trace.memory_mb / 1024 if trace.memory_mb is not None else None
    minutes = trace.minutes
    continuing = np.zeros(minutes + 2, dtype=np.int64)  # busy bytes carried into a minute
    active = np.zeros(minutes + 2, dtype=np.int64)  # busy bytes in a minute
    later: dict[int, list[int]] = defaultdict(list)  # minute: sizes of later runs starting
    first_calls = 0
    for f in range(trace.counts.shape[0]):
        firsts, lasts, _ = _runs(trace.counts[f])
        if not len(firsts):
            continue
        first_calls += 1
        size = max(1, int(_instance_gb(memory, f) * GB))
        np.add.at(continuing, firsts + 1, size)
        np.add.at(continuing, lasts + 1, -size)
        np.add.at(active, firsts, size)
        np.add.at(active, lasts + 1, -size)
        for first in firsts[1:].tolist():
            later[first].append(size)
    continuing = np.cumsum(continuing)
    active = np.cumsum(active)
    if budget_gb is None:
        return Floor(None, first_calls, 0, 0)
    budget = int(budget_gb * GB)
    over = 0
    for t, sizes in later.items():
        room = budget - int(continuing[t])
        fitting = int(np.searchsorted(np.cumsum(sorted(sizes)), room, side="right"))
        over += len(sizes) - fitting
    busy_over = int((active[:minutes] > budget).sum())
    return Floor(budget_gb, first_calls, over, busy_over)
