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

Pre-warming at the call's minute is the best any policy can do, so on a
*strict* node (idle instances never above the budget) ``first_calls +
over_budget`` is the fewest cold starts with pre-warming allowed, and it is
exact, not only a bound: an oracle that pre-warms the smallest runs that fit in
each minute and unloads every instance as its run ends reaches it (minutes do
not interact when loading ahead costs nothing). It needs no assumption on sizes
or on what a cold start costs: only the count of cold starts is bounded.

:func:`~fnrt.runtime.prewarm.node.simulate_node` and the server are *lenient*:
a load that cannot fit beside the busy instances goes over the budget (every
idle instance evicted first), and the instances busy then stay loaded as they
go idle, over the budget, until the next load. A run can be warm on such
leftovers where the strict node has no room, so ``over_budget`` alone bounds
nothing there. ``over_budget_kept`` is the bound that holds on the lenient
node: memory can be over the budget at the start of a minute ``t`` only if
the last load that went over it, in some minute ``s`` whose busy instances
alone exceed the budget, was followed by no load at all (any load after it
evicts down to the budget), so what is loaded then is a subset of the
functions busy in ``s``, and no run in between started a function outside
them (nor a first call: each is a load). A run of minute ``t`` is counted cold
only when it is cold by the strict count and, besides, its function is busy
in no such ``s``. The floor (:attr:`Floor.cold_starts`) is ``first_calls +
over_budget_kept``: a goal of ``x`` times a peer's cold starts is out of reach
for every policy when ``floor > x * peer``.

Belady's evictions (``node.ORACLE``) are no bound: with instances of
different sizes, evicting the one called furthest ahead per GB is a
heuristic (the offline problem with sizes is NP-hard, Chrobak et al.,
"Caching is hard, even in the fault model", 2012), and it never pre-warms.
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
    over_budget: int  # on a strict node (idle instances never above the budget)
    busy_over_minutes: int  # minutes whose busy instances alone exceed the budget
    over_budget_kept: int = 0  # on a lenient node, which keeps what was busy over it

    @property
    def cold_starts(self) -> int:
        """The cold starts no policy avoids on a lenient node (``simulate_node``'s)."""
        return self.first_calls + self.over_budget_kept

    @property
    def strict_cold_starts(self) -> int:
        """The fewest cold starts on a strict node, which an oracle pre-warmer reaches."""
        return self.first_calls + self.over_budget


@dataclass
class _Busy:
    """A trace's runs as the floor counts them."""

    continuing: np.ndarray  # busy bytes carried into each minute
    active: np.ndarray  # busy bytes in each minute
    later: dict[int, list[tuple[int, int]]]  # minute: (size, f) of the later runs starting
    firsts_at: dict[int, list[int]]  # minute: the functions called first then
    spans: list[tuple[int, int, int]]  # (f, first, last) of every run
    first_calls: int


def _busy(trace: Trace) -> _Busy:
    memory = trace.memory_mb / 1024 if trace.memory_mb is not None else None
    minutes = trace.minutes
    continuing = np.zeros(minutes + 2, dtype=np.int64)  # busy bytes carried into a minute
    active = np.zeros(minutes + 2, dtype=np.int64)  # busy bytes in a minute
    later: dict[int, list[tuple[int, int]]] = defaultdict(list)  # minute: (size, f) starting
    firsts_at: dict[int, list[int]] = defaultdict(list)  # minute: first calls
    spans: list[tuple[int, int, int]] = []  # (f, first, last) of every run
    first_calls = 0
    for f in range(trace.counts.shape[0]):
        firsts, lasts, _ = _runs(trace.counts[f])
        if not len(firsts):
            continue
        first_calls += 1
        firsts_at[int(firsts[0])].append(f)
        size = max(1, int(_instance_gb(memory, f) * GB))
        np.add.at(continuing, firsts + 1, size)
        np.add.at(continuing, lasts + 1, -size)
        np.add.at(active, firsts, size)
        np.add.at(active, lasts + 1, -size)
        for first in firsts[1:].tolist():
            later[first].append((size, f))
        spans.extend((f, a, b) for a, b in zip(firsts.tolist(), lasts.tolist(), strict=True))
    return _Busy(np.cumsum(continuing), np.cumsum(active), later, firsts_at, spans, first_calls)


def _strict(busy: _Busy, budget: int) -> dict[int, list[tuple[int, int]]]:
    """Minute: the later runs cold by the strict count (those that do not fit beside the
    runs busy on from the minute before, the smallest fitting first)."""
    strict: dict[int, list[tuple[int, int]]] = {}
    for t, runs in busy.later.items():
        room = budget - int(busy.continuing[t])
        ordered = sorted(runs)
        fitting = int(np.searchsorted(np.cumsum([r[0] for r in ordered]), room, side="right"))
        if fitting < len(ordered):
            strict[t] = ordered[fitting:]
    return strict


def floor(trace: Trace, budget_gb: float | None) -> Floor:
    """The floor of cold starts for ``trace`` on one node of ``budget_gb``."""
    if budget_gb is not None and not budget_gb > 0:
        raise ValueError("budget_gb: must be > 0")
    busy = _busy(trace)
    if budget_gb is None:
        return Floor(None, busy.first_calls, 0, 0)
    budget = int(budget_gb * GB)
    strict = _strict(busy, budget)
    over = sum(len(r) for r in strict.values())
    over_minutes = np.flatnonzero(busy.active[: trace.minutes] > budget)
    kept = _kept(trace, busy.spans, busy.later, busy.firsts_at, strict, over_minutes)
    return Floor(budget_gb, busy.first_calls, over, len(over_minutes), kept)


def strict_cold(trace: Trace, budget_gb: float) -> set[tuple[int, int]]:
    """The runs (minute, function index) cold by the strict count on a node of
    ``budget_gb``: first calls, and the runs that do not fit beside those busy on (an
    oracle that pre-warms each run in its minute reaches exactly these on a strict node).
    A policy's cold start outside them is one the oracle avoids (``bench/prewarm.py
    --causes`` splits each cause so)."""
    if not budget_gb > 0:
        raise ValueError("budget_gb: must be > 0")
    busy = _busy(trace)
    cold = {(t, f) for t, fs in busy.firsts_at.items() for f in fs}
    for t, runs in _strict(busy, int(budget_gb * GB)).items():
        cold.update((t, f) for _, f in runs)
    return cold


def _kept(
    trace: Trace,
    spans: list[tuple[int, int, int]],
    later: dict[int, list[tuple[int, int]]],
    firsts_at: dict[int, list[int]],
    strict: dict[int, list[tuple[int, int]]],
    over_minutes: np.ndarray,
) -> int:
    """The strict count's cold runs that stay cold on a lenient node (module docstring):
    a run of minute ``t`` may be warm on leftovers of a minute ``s < t`` over the budget
    when its function was busy in ``s`` and every run that started after ``s`` and
    before ``t`` was of a function busy in ``s`` (no load in between)."""
    if not len(over_minutes):
        return sum(len(r) for r in strict.values())
    functions, minutes = trace.counts.shape
    busy = np.zeros((functions, minutes), dtype=bool)
    for f, a, b in spans:
        busy[f, a : b + 1] = True
    # for each minute over the budget, the first later minute that starts a run of a
    # function not busy in it (first calls included): a load, after which no leftover
    # of it is over the budget; the runs of that minute itself may still find them
    starting: dict[int, list[int]] = defaultdict(list)
    for t, runs in later.items():
        starting[t].extend(f for _, f in runs)
    for t, fs in firsts_at.items():
        starting[t].extend(fs)
    ends = np.full(len(over_minutes), minutes - 1)
    for i, s in enumerate(over_minutes.tolist()):
        on = busy[:, s]
        for u in range(s + 1, minutes):
            started = starting.get(u, [])
            if started and not bool(on[started].all()):
                ends[i] = u
                break
    cold = 0
    for t, runs in strict.items():
        leftover = over_minutes[(over_minutes < t) & (ends >= t)]
        union = np.asarray(busy[:, leftover].any(axis=1))
        cold += min(len(runs), sum(1 for _, f in later[t] if not union[f]))
    return cold
