"""One node's memory as a cache of warm functions: keep-alive policies under a budget.

The node holds one instance per function, at minute granularity, as
:mod:`~fnrt.runtime.prewarm.simulator` does, but in a memory of
``budget_gb``: a cold start that does not fit evicts idle instances first, in
the order :func:`fnrt.loader.memory.evictions` gives (the server's own
decision), each weighed as its policy says:

- ``auto_plan``: its plan's :class:`~fnrt.runtime.prewarm.policies.Worth` (the
  expected price of the cold start it saves per GB·minute it will yet be
  held). Plans unload instances early ("plan") and at their window's end
  ("idle") and pre-warm them, only into free memory, as the server does with
  ``--no-fill-memory``; a plan made while the working set (below) is over the
  budget is made at the share of it the budget holds times the price
  (:func:`~fnrt.runtime.prewarm.policies.scarce`).
- ``auto_fill``: every plan fills the budget (``fnrt serve --fill-memory``): it
  is made at :data:`~fnrt.runtime.prewarm.policies.FILL_PRICE_FACTOR` the
  price, its instance is kept past it while the budget has room (the node holds
  the memory it was given and evicts first those past their plans, least worth
  first, then by worth), and its pre-warm may evict instances worth less than
  the one it loads, never one pre-warmed for a call that is due.
- ``auto``: the server's default under a budget it was given: each plan, made
  after a call, fills the budget as ``auto_fill``'s do when the working set then
  (what a fixed keep-alive would hold: the functions called in the last
  ``keep_alive_min`` minutes) fits it, else is planned as ``auto_plan``'s are
  (:func:`~fnrt.runtime.prewarm.policies.fills`).
- ``fixed``: a 10-minute keep-alive ("idle"); under the budget, the least
  recently used goes first (what the server did before plans weighed in).
- ``lru``: kept until evicted, least recently used first.
- ``belady`` (not a policy a node can run: it knows every call ahead): kept until
  evicted, the one whose next call is furthest per GB first, never pre-warmed.
  With instances of different sizes this is a heuristic, not the optimum of
  eviction alone (that problem is NP-hard), and no bound:
  :func:`~fnrt.runtime.prewarm.bound.floor` is the bound.
- ``greedy_dual``: FaasCache's Greedy-Dual-Size-Frequency keep-alive
  (Fuerst and Sharma, ASPLOS 2021): kept until evicted, lowest priority first,
  ``priority = clock + frequency * cost / size`` set at each call (frequency:
  the calls since it was loaded; cost: a cold start's, 1 here, as every cold
  start counts the same; size: its memory), and on each eviction the clock
  becomes the highest priority evicted.

A run of busy minutes is never evicted; when the busy ones alone fill the
budget a load goes over it, as in the server. In a minute, the unloads plans
set for it come before its pre-warms (the server's sweeps try a pre-warm again
every second, so the room an unload frees at the minute's start is there for
it), then its calls, in the trace's order of functions. Every cold start is
counted by its :class:`Cause`. ``budget_gb=None``: no bound
(then ``auto`` and ``fixed`` give exactly :func:`~fnrt.runtime.prewarm.
simulator.simulate_one`'s figures).
"""

from __future__ import annotations

import bisect
import heapq
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

import numpy as np

from fnrt.loader.memory import Held, evictions
from fnrt.runtime.prewarm.history import History
from fnrt.runtime.prewarm.policies import (
    Plan,
    Policy,
    PolicyConfig,
    Worth,
    decide,
    filling,
    fills,
    node_mean_gb,
    scarce,
    weigh,
    worth,
)
from fnrt.runtime.prewarm.simulator import _instance_gb, _runs
from fnrt.runtime.prewarm.trace import Trace

#: The policies a node's memory is compared under.
NODE_POLICIES = ("auto", "auto_plan", "auto_fill", "fixed", "greedy_dual", "lru")
#: The ``auto`` policies: whether a plan fills the budget (None: as :func:`fills` says).
AUTO_FILLS: dict[str, bool | None] = {"auto": None, "auto_plan": False, "auto_fill": True}


class Cause(Enum):
    """Why a run found its function cold (:attr:`NodeOutcome.causes`)."""

    FIRST_CALL = "first call"
    BUDGET_AFTER_CALL = "budget, after a call"  # evicted for a load, kept after its call
    BUDGET_AHEAD = "budget, after a pre-warm"  # evicted before the call it was loaded for
    TOO_LATE = "plan, pre-warm too late"  # unloaded by its plan; called before the pre-warm
    NO_ROOM = "plan, pre-warm found no room"  # unloaded by its plan; the pre-warm did not fit
    NOT_KEPT = "plan, not kept"  # unloaded by its plan for good (a window of no minutes)
    RAN_OUT = "window ran out"  # its keep-alive, or its pre-warm's window, ended before


#: A bound, not a policy: evictions that know every call ahead.
ORACLE = "belady"
#: Not a policy either: plans that know each function's next call (pre-warmed in its
#: minute, unloaded after each run), evictions as Belady's, pre-warms into free memory.
CLAIRVOYANT = "clairvoyant"
GB = 2**30


@dataclass(frozen=True)
class NodeOutcome:
    """One policy on one node of ``budget_gb`` (None: unbounded) over a trace."""

    policy: str
    budget_gb: float | None
    invocations: int
    cold_starts: int
    evictions: dict[str, int]  # by reason: budget, plan, idle
    idle_gb_minutes: float  # memory loaded with no call running
    peak_gb: float
    prewarms: int
    prewarms_skipped: int  # no free memory: not loaded ahead
    order: list[tuple[int, str]] = field(default_factory=list)  # (minute, function) evicted
    causes: dict[Cause, int] = field(default_factory=dict)  # cold starts by cause
    colds: list[tuple[int, str, Cause]] = field(default_factory=list)  # record: each one

    @property
    def cold_percent(self) -> float:
        return 100.0 * self.cold_starts / max(self.invocations, 1)


@dataclass
class _Held:
    last_call: int  # the minute of its last call
    freq: int = 0  # greedy_dual: calls since loaded
    priority: float = 0.0  # greedy_dual
    worth: Worth | None = None  # auto
    token: int = 0  # its pending unload/pre-warm, by plan


def simulate_node(
    trace: Trace,
    policy: str,
    budget_gb: float | None,
    config: PolicyConfig | None = None,
    *,
    record: bool = False,
) -> NodeOutcome:
    """Replay ``trace`` on one node under ``policy`` (one of :data:`NODE_POLICIES`);
    ``record``: keep the order of budget evictions (minute, function)."""
    if policy not in (*NODE_POLICIES, ORACLE, CLAIRVOYANT):
        names = ", ".join((*NODE_POLICIES, ORACLE, CLAIRVOYANT))
        raise ValueError(f"policy: {policy!r} is not one of {names}")
    if budget_gb is not None and not budget_gb > 0:
        raise ValueError("budget_gb: must be > 0")
    config = config or PolicyConfig()
    # auto's unit of price, as a node's keeper has it, unless given: the mean instance of
    # the functions it has planned for so far (the trace's later ones are unknown to a
    # node), each from the sweep after its first busy minute (in the function table's
    # order within a sweep); ``joining``: (first busy minute, function), in that order
    by_node = config.mean_instance_gb is None
    base = config
    plain, filled = config, filling(config)  # a plan that fills the budget: at 4x the price
    joining: list[tuple[int, int]] = []
    joined, joined_gb = 0, 0.0
    planned = policy in (*AUTO_FILLS, "fixed", CLAIRVOYANT)
    memory = trace.memory_mb / 1024 if trace.memory_mb is not None else None
    functions = trace.counts.shape[0]
    gb = [_instance_gb(memory, f) for f in range(functions)]
    size = [max(1, int(g * GB)) for g in gb]
    budget = None if budget_gb is None else int(budget_gb * GB)
    # what fixed keep-alive would hold: whether a plan fills the budget, or how scarce it is
    sized = budget is not None and policy in ("auto", "auto_plan")
    working_set = _working_set(trace, size, config.keep_alive_min) if sized else []
    filling_plan: dict[int, bool] = {}  # each function's last plan: does it fill the budget
    starts: dict[int, list[tuple[int, int]]] = defaultdict(list)
    ends: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    calls_at: list[list[int]] = []  # belady: each function's runs' first minutes
    invocations = 0
    for f in range(functions):
        firsts, lasts, sums = _runs(trace.counts[f])
        calls_at.append(firsts.tolist())
        if len(firsts):
            joining.append((int(firsts[0]), f))
        for first, last, calls in zip(firsts.tolist(), lasts.tolist(), sums.tolist(), strict=True):
            starts[first].append((f, calls))
            ends[last].append((f, first, calls))
            invocations += calls
    histories: dict[int, History] = {}
    loaded: dict[int, _Held] = {}
    tokens: dict[int, int] = defaultdict(int)
    running: set[int] = set()
    ahead: set[int] = set()  # loaded by a pre-warm, not yet called
    # (minute, 0 for an unload or 1 for a pre-warm, function, token, what): in a minute, its
    # unloads come first, then its pre-warms, as on the server, whose sweeps try a pre-warm
    # again every second: an unload at the minute's start frees room for its pre-warms
    timers: list[tuple[int, int, int, int, str]] = []
    used = running_bytes = 0
    peak = 0
    cold = prewarms = skipped = 0
    evicted: dict[str, int] = {"budget": 0, "plan": 0, "idle": 0}
    order: list[tuple[int, str]] = []
    idle = 0.0
    clock = 0.0  # greedy_dual
    minutes = trace.minutes
    joining.sort()
    agenda = sorted(set(starts) | set(ends))
    t_prev = -1

    def unload(f: int, reason: str) -> None:
        nonlocal used
        del loaded[f]
        gone[f] = (reason, f in ahead)
        ahead.discard(f)
        used -= size[f]
        evicted[reason] += 1

    def appraise(f: int, held: _Held, now: int, below: float | None = None) -> Held:
        """What keeping ``f`` is worth now, as the server's budget weighs it (``below``: for
        a pre-warm worth that much, see :meth:`fnrt.loader.memory.MemoryBudget.held`)."""
        pinned = f in running
        value = 0.0  # fixed, lru: all the same, least recently used first
        if policy == "greedy_dual":
            value = held.priority
        elif policy in (ORACLE, CLAIRVOYANT):
            i = bisect.bisect_left(calls_at[f], now)  # a run due this minute: the most
            value = 1.0 / (gb[f] * (calls_at[f][i] - now + 1)) if i < len(calls_at[f]) else 0.0
        elif held.worth is not None:  # auto
            kept = filling_plan.get(f, False)
            plan = _due_worth.get(f, held.worth) if kept else held.worth
            value, due = weigh(plan, now - held.last_call, held.worth if kept else None)
            pinned = pinned or (below is not None and due)
        pinned = pinned or (below is not None and value >= below)
        return Held(str(f), size[f], value, float(held.last_call), pinned)

    def step(t: int) -> None:
        """Unloads and pre-warms the timers set for minute ``t``."""
        nonlocal used, peak, prewarms, skipped
        while timers and timers[0][0] <= t:
            _, _, f, token, what = heapq.heappop(timers)
            if token != tokens[f] or f in running:
                continue
            if what == "prewarm":
                if f in loaded:
                    continue
                if filling_plan.get(f, False) and budget is not None and used + size[f] > budget:
                    plan_worth = _due_worth.get(f)
                    if plan_worth is not None:
                        value = plan_worth.at(plan_worth.first - 1)  # as its window opens
                        weighed = [appraise(g, h, t, value) for g, h in loaded.items()]
                        freed = evictions(budget, size[f], weighed)
                        if used - sum(size[int(k)] for k in freed) + size[f] <= budget:
                            for key in freed:
                                unload(int(key), "budget")
                                if record:
                                    order.append((t, trace.functions[int(key)]))
                if budget is None or used + size[f] <= budget:
                    last_call = histories[f].last_minute or 0
                    loaded[f] = _Held(last_call, worth=_plan_worth.get(f), token=token)
                    ahead.add(f)
                    used += size[f]
                    peak = max(peak, used)
                    prewarms += 1
                elif t < _closes.get(f, t):  # tried again next minute, as the sweeps do
                    heapq.heappush(timers, (t + 1, 1, f, token, "prewarm"))
                else:
                    skipped += 1
            elif f in loaded:
                unload(f, what)

    gone: dict[int, tuple[str, bool]] = {}  # each unloaded function: why, and if pre-warmed
    prewarm_at: dict[int, int] = {}  # the minute of each function's pending pre-warm
    causes = dict.fromkeys(Cause, 0)
    colds: list[tuple[int, str, Cause]] = []

    def cause(f: int, t: int) -> Cause:
        """Why ``f``'s run at minute ``t`` is cold."""
        if f not in histories and f not in gone:
            return Cause.FIRST_CALL
        reason, was_ahead = gone.get(f, ("idle", False))
        if reason == "budget":
            return Cause.BUDGET_AHEAD if was_ahead else Cause.BUDGET_AFTER_CALL
        if reason == "plan":
            at = prewarm_at.get(f)
            if at is None:
                return Cause.NOT_KEPT
            return Cause.TOO_LATE if t < at else Cause.NO_ROOM
        return Cause.RAN_OUT

    _plan_worth: dict[int, Worth] = {}
    _closes: dict[int, int] = {}  # the last minute of each plan's pre-warm window
    _due_worth: dict[int, Worth] = {}  # fill: the plan's own window, for its pre-warm
    for t in [*agenda, minutes]:
        # the minutes between events: timers fire, memory sits idle
        while timers and timers[0][0] < t:
            m = timers[0][0]
            if m > t_prev + 1:
                idle += (used - running_bytes) * (m - t_prev - 1) / GB
                t_prev = m - 1
            step(m)
        if t > t_prev + 1:
            idle += (used - running_bytes) * (t - t_prev - 1) / GB
        if t >= minutes:
            break
        step(t)
        for f, calls in starts.get(t, ()):
            tokens[f] += 1  # its pending plan is void
            held = loaded.get(f)
            if held is None:
                cold += 1
                why = cause(f, t)
                causes[why] += 1
                if record:
                    colds.append((t, trace.functions[f], why))
                if budget is not None and used + size[f] > budget:
                    candidates = [appraise(g, h, t) for g, h in loaded.items()]
                    victims = evictions(budget, size[f], candidates)
                    for key in victims:
                        g = int(key)
                        if policy == "greedy_dual":
                            clock = max(clock, loaded[g].priority)
                        unload(g, "budget")
                        if record:
                            order.append((t, trace.functions[g]))
                held = loaded[f] = _Held(t)
                used += size[f]
                peak = max(peak, used)
            ahead.discard(f)
            held.freq += calls
            running.add(f)
            running_bytes += size[f]
        idle += (used - running_bytes) / GB
        for f, first, calls in ends.get(t, ()):
            running.discard(f)
            running_bytes -= size[f]
            held = loaded[f]
            held.last_call = t
            if policy == "greedy_dual":
                held.priority = clock + held.freq * 1.0 / gb[f]
            if not planned:
                continue
            history = histories.setdefault(f, History())
            history.record_run(first, t, calls)
            if by_node and joined < len(joining) and joining[joined] <= (t, f):
                while joined < len(joining) and joining[joined] <= (t, f):
                    joined_gb += gb[joining[joined][1]]
                    joined += 1
                at_mean = replace(base, mean_instance_gb=node_mean_gb(joined_gb, joined))
                plain, filled = at_mean, filling(at_mean)
            kind = Policy.FIXED if policy == "fixed" else Policy.AUTO
            fill = budget is not None and AUTO_FILLS.get(policy, False) is not False
            if fill and AUTO_FILLS[policy] is None:  # the default: while the working set fits
                fill = fills(working_set[t], budget)
            filling_plan[f] = fill
            config = filled if fill else plain
            if working_set and not fill:  # short of memory: at the share the budget holds
                config = scarce(plain, working_set[t], budget)
            if policy == CLAIRVOYANT:
                kind, plan = Policy.FIXED, _next_call(calls_at[f], t)
            else:
                plan = decide(kind, config, history, t, gb[f])
            token = tokens[f] = tokens[f] + 1
            if kind is Policy.AUTO:
                held.worth = _plan_worth[f] = worth(config, history, plan, gb[f], cached=fill)
                if fill:
                    _due_worth[f] = worth(config, history, plan, gb[f])
            begin, end = plan.loaded
            _closes[f] = t + end
            if plan.prewarm_after_min and end >= begin:
                prewarm_at[f] = t + begin
            else:
                prewarm_at.pop(f, None)
            if fill:  # kept while memory is free; loaded again ahead when evicted
                if plan.prewarm_after_min and end >= begin:
                    heapq.heappush(timers, (t + begin, 1, f, token, "prewarm"))
                continue
            if plan.prewarm_after_min or end < 1:
                heapq.heappush(timers, (t + 1, 0, f, token, "plan"))
                if plan.prewarm_after_min and end >= begin:
                    heapq.heappush(timers, (t + begin, 1, f, token, "prewarm"))
                    heapq.heappush(timers, (t + end + 1, 0, f, token, "idle"))
            else:
                heapq.heappush(timers, (t + end + 1, 0, f, token, "idle"))
        t_prev = t
    return NodeOutcome(
        policy,
        budget_gb,
        invocations,
        cold,
        evicted,
        idle,
        peak / GB,
        prewarms,
        skipped,
        order,
        {k: v for k, v in causes.items() if v},
        colds,
    )


def _next_call(calls_at: list[int], now: int) -> Plan:
    """The clairvoyant plan after a run that ended at minute ``now``: loaded in the minute
    of the next run only (kept a minute when it comes right after), or not at all."""
    i = bisect.bisect_right(calls_at, now)
    if i == len(calls_at):
        return Plan(0, 0, why="no call ahead")
    d = calls_at[i] - now
    return Plan(0, 1, why="next call") if d == 1 else Plan(d, 1, why="next call")


def _working_set(trace: Trace, size: list[int], keep_alive_min: int) -> list[float]:
    """What a fixed keep-alive of ``keep_alive_min`` would hold after each minute, in
    bytes: the instances of the functions called in it or in the ``keep_alive_min``
    minutes before (what the server's keeper counts from its histories,
    :meth:`~fnrt.runtime.prewarm.keeper.Keeper.working_set_bytes`)."""
    change = np.zeros(trace.minutes + 1, dtype=np.float64)
    for f in range(trace.counts.shape[0]):
        firsts, lasts, _ = _runs(trace.counts[f])
        begin, end = -1, -2
        for first, last in zip(firsts.tolist(), lasts.tolist(), strict=True):
            if first > end + 1:  # a new stretch: the last one's is over
                if begin >= 0:
                    change[begin] += size[f]
                    change[min(end + 1, trace.minutes)] -= size[f]
                begin = first
            end = last + keep_alive_min
        if begin >= 0:
            change[begin] += size[f]
            change[min(end + 1, trace.minutes)] -= size[f]
    out: list[float] = np.cumsum(change[: trace.minutes]).tolist()
    return out


def compare(
    trace: Trace,
    budgets_gb: Sequence[float | None],
    policies: Sequence[str] = NODE_POLICIES,
    config: PolicyConfig | None = None,
) -> list[NodeOutcome]:
    """Every policy at every budget (in that order)."""
    return [simulate_node(trace, p, b, config) for b in budgets_gb for p in policies]


def fixed_peak_gb(trace: Trace, config: PolicyConfig | None = None) -> float:
    """The peak memory of a fixed 10-minute keep-alive with no budget: what budgets given
    as a share (``50%``) are shares of."""
    return simulate_node(trace, "fixed", None, config).peak_gb
