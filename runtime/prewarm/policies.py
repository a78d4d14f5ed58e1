"""Keep-alive and pre-warm policies: pure functions of (history, now) -> plan.

After a function's last call (at minute ``now``), a :class:`Plan` says how
long to keep its instance loaded, or when to unload it and when to load it
again ahead of the predicted next call:

- ``fixed``: keep it ``keep_alive_min`` (10 by default, as many platforms do).
- ``histogram``: the hybrid histogram policy of "Serverless in the Wild"
  (Shahrad et al., ATC 2020): from the histogram of idle times, unload at
  once and pre-warm at its ``head_percentile`` (5th), keep warm until its
  ``tail_percentile`` (99th), each with a ``margin``. When the histogram is
  not representative it falls back: too few samples or too flat (coefficient
  of variation under ``min_cv``) -> ``fixed``; most idle times beyond its
  range -> a forecast from recent idle times when they are regular (the
  paper uses ARIMA and a +-15% window; here a weighted mean and a window of
  two standard deviations), else ``fixed``.
- ``time_of_day``: when past days had a call within the next
  ``lookahead_min`` minutes at the same time of day on at least
  ``min_days`` days, pre-warm a minute before it.
- ``trend``: when the call rate is rising, keep more instances warm ahead
  (``instances``), and never unload while it rises.
- ``auto`` (the default): the plan with the least expected cost, where a
  cold start is priced in seconds of the node's mean instance
  (``cold_start_price_mean_s``: the same on every workload, whatever its
  functions' sizes; or in GB·s, ``cold_start_price_gb_s``, or seconds of the
  function's own instance, ``cold_start_price_s``) and an idle minute costs
  the function's memory. Over the idle times seen,
  blended with a few pseudo-samples of a scale-free prior (so a short
  history does not overfit), it finds the best window of minutes to be
  loaded, the pre-warm lead and the keep-alive together (:func:`best_window`,
  exact and linear in the histogram's range), and compares it with the
  forecast for idle times past the range and the time-of-day prediction.
  Large functions get tight windows, small ones generous ones; a higher
  price buys fewer cold starts with more memory. Trend decides the
  instances.

How far a pre-warm goes is the runtime's call when it acts: into memory
(L1) when the memory budget has room without evicting anyone, else only
the files into the disk cache (L2). The same functions drive the runtime
and ``fnrt simulate``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

import numpy as np

from fnrt.runtime.prewarm.history import History


class Policy(Enum):
    FIXED = "fixed"
    HISTOGRAM = "histogram"
    TIME_OF_DAY = "time_of_day"
    TREND = "trend"
    AUTO = "auto"


#: ``auto``'s default price of a cold start, in seconds of the node's mean instance.
DEFAULT_PRICE_MEAN_S = 4000.0


#: A plan that fills the node's memory budget (keeps its instance past the plan while the
#: budget has room) holds idle memory for nothing while there is room, so ``auto`` plans
#: it at this many times the price of a cold start: its plans then rank who stays when
#: the budget is short (bench/prewarm.py --checks 4: at a budget of fixed 10 minutes'
#: peak, 0.57x to 0.87x the cold starts at 1x, on each half of the Azure sample and every
#: synthetic day).
FILL_PRICE_FACTOR = 4.0

#: Under a memory budget, a plan fills it when what a fixed keep-alive would hold then
#: (the instances of the functions called in its last ``keep_alive_min`` minutes) is at
#: most this share of the budget (:func:`fills`).
FILL_SHARE = 1.0


def node_mean_gb(total_gb: float, functions: int) -> float:
    """``auto``'s unit of price on a node: the mean instance of the ``functions`` it has
    planned for so far (``total_gb`` together), to two significant digits, 1 GB before
    any. The server's keeper and ``fnrt simulate --node-memory-gb`` both price by it."""
    if not functions:
        return 1.0
    return float(f"{max(total_gb / functions, 1e-6):.2g}")


def filling(config: PolicyConfig) -> PolicyConfig:
    """``config`` for a plan that fills the memory budget (:data:`FILL_PRICE_FACTOR`)."""
    return replace(config, price_factor=FILL_PRICE_FACTOR)


def fills(working_set_bytes: float, budget_bytes: float | None) -> bool:
    """Whether a plan made now fills the node's memory budget (the default, with no
    ``--fill-memory``/``--no-fill-memory``): yes while the node's working set, what a
    fixed keep-alive of ``keep_alive_min`` would hold now, fits :data:`FILL_SHARE` of the
    budget, so the budget has room the plans alone would leave idle; no when it does
    not (the budget is short, and plans at the plain price decide who stays), nor with
    no budget. The server's keeper and ``fnrt simulate --node-memory-gb`` both ask here
    after each call, with the same working set."""
    return budget_bytes is not None and working_set_bytes <= FILL_SHARE * budget_bytes


def scarce(
    config: PolicyConfig, working_set_bytes: float, budget_bytes: float | None
) -> PolicyConfig:
    """``config`` for a plan that does not fill the memory budget, made while the node's
    working set (what a fixed keep-alive of ``keep_alive_min`` would hold now) is over
    it: memory is scarcer than the price of a cold start assumes, by the share of that
    working set the budget holds, so the price is that share of itself (the mirror of
    :data:`FILL_PRICE_FACTOR`, no number fitted). Windows shrink as the budget does: a
    function with calls due soon is loaded just before them and released after, and the
    memory is left to those whose calls a window catches at less idle memory. Unchanged
    when the working set fits or with no budget. The server's keeper and ``fnrt simulate
    --node-memory-gb`` both ask here after each call, with the same working set."""
    if budget_bytes is None or working_set_bytes <= budget_bytes:
        return config
    share = max(budget_bytes, 1.0) / working_set_bytes
    return replace(config, price_factor=config.price_factor * share)


@dataclass(frozen=True)
class PolicyConfig:
    keep_alive_min: int = 10
    head_percentile: float = 5.0
    tail_percentile: float = 99.0
    margin: float = 0.10
    min_samples: int = 5
    min_cv: float = 2.0
    max_out_of_range: float = 0.5
    max_forecast_cv: float = 0.5  # recent idle times more spread than this: no forecast
    min_days: int = 2
    lookahead_min: int = 240
    rising_per_min: float = 0.5  # rate slope (calls/min per min) that counts as rising
    max_instances: int = 8
    #: auto: a cold start is worth keeping the node's mean instance loaded this long
    #: (chosen by bench/prewarm.py on half of its days, checked on the other half)
    cold_start_price_mean_s: float = DEFAULT_PRICE_MEAN_S
    mean_instance_gb: float | None = None  # the node's mean instance (None: 1 GB)
    cold_start_price_gb_s: float | None = None  # or: this much idle memory, in GB·s
    cold_start_price_s: float | None = None  # or: this many seconds of the function's own instance
    prior_weight: float = 3.0  # auto: pseudo-samples of the scale-free idle-time prior
    prior_range_min: int = 1440  # auto: the prior's idle times, 1 minute to a day
    min_instance_gb: float = 1 / 64  # auto: an instance costs at least this much memory
    #: auto: every price above times this (a node that fills its budget: FILL_PRICE_FACTOR)
    price_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.keep_alive_min < 0:
            raise ValueError("keep_alive_min: must be >= 0")
        if not 0 <= self.head_percentile < self.tail_percentile <= 100:
            raise ValueError("head_percentile, tail_percentile: need 0 <= head < tail <= 100")
        if not 0 <= self.margin < 1:
            raise ValueError("margin: must be a fraction from 0 to 1")
        if self.min_samples < 1 or self.min_days < 1 or self.lookahead_min < 1:
            raise ValueError("min_samples, min_days, lookahead_min: must be >= 1")
        for name in ("cold_start_price_mean_s", "cold_start_price_gb_s", "cold_start_price_s"):
            if not (getattr(self, name) or 0) >= 0:
                raise ValueError(f"{name}: must be >= 0")
        if self.mean_instance_gb is not None and not self.mean_instance_gb > 0:
            raise ValueError("mean_instance_gb: must be > 0")
        if self.prior_weight < 0 or self.prior_range_min < 1 or self.min_instance_gb <= 0:
            raise ValueError("prior_weight: must be >= 0; min_instance_gb: must be > 0")
        if not self.price_factor > 0:
            raise ValueError("price_factor: must be > 0")

    def cold_start_gb_min(self, memory_gb: float) -> float:
        """What one cold start of an instance of ``memory_gb`` is worth, in GB·min."""
        factor = self.price_factor  # 1.0: exactly the price as set
        if self.cold_start_price_s is not None:
            return self.cold_start_price_s / 60.0 * max(memory_gb, self.min_instance_gb) * factor
        if self.cold_start_price_gb_s is not None:
            return self.cold_start_price_gb_s / 60.0 * factor
        mean = max(self.mean_instance_gb or 1.0, self.min_instance_gb)
        return self.cold_start_price_mean_s / 60.0 * mean * factor


@dataclass(frozen=True)
class Plan:
    """What to do after a call in minute ``a``, for the next call in minute ``a + d``.

    ``prewarm_after_min`` 0: stay loaded for minutes ``a+1 .. a+keep_alive_min``.
    Otherwise unload at once and load again for minutes ``a+p .. a+p+keep_alive_min-1``
    (``p`` = ``prewarm_after_min``). ``instances``: how many to hold warm;
    ``why``: the rule that decided.
    """

    prewarm_after_min: int
    keep_alive_min: int
    instances: int = 1
    why: str = ""

    @property
    def loaded(self) -> tuple[int, int]:
        """The first and last minute after the call (``d``) with an instance loaded."""
        if self.prewarm_after_min == 0:
            return 1, self.keep_alive_min
        return self.prewarm_after_min, self.prewarm_after_min + self.keep_alive_min - 1

    def warm(self, d: int) -> bool:
        """Is a call ``d`` minutes after the last one served warm?"""
        first, last = self.loaded
        return first <= d <= last

    def idle_loaded_min(self, d: int) -> int:
        """Minutes loaded with no call before the next call ``d`` minutes later."""
        first, last = self.loaded
        return max(0, min(last, d - 1) - first + 1)

    def warm_many(self, d: np.ndarray) -> np.ndarray:
        """:meth:`warm` for an array of ``d`` (a plan that does not change)."""
        first, last = self.loaded
        return (first <= d) & (d <= last)

    def idle_loaded_many(self, d: np.ndarray) -> np.ndarray:
        """:meth:`idle_loaded_min` for an array of ``d``."""
        first, last = self.loaded
        out: np.ndarray = np.maximum(0, np.minimum(last, d - 1) - first + 1)
        return out


def fixed(config: PolicyConfig, history: History, now: int) -> Plan:
    return Plan(0, config.keep_alive_min, why="fixed")


def _percentile_bin(history: History, percentile: float) -> int:
    """The idle time (minutes) under which ``percentile`` % of in-range samples fall."""
    wanted = history.in_range * percentile / 100.0
    seen = 0
    bins = history.bins
    for i in history.nonzero:  # only the bins with samples, in order
        seen += bins[i]
        if seen >= wanted:
            return i
    return history.nonzero[-1] if history.nonzero else 0


def representative(config: PolicyConfig, history: History) -> str:
    """Empty when the histogram can be trusted, else why not."""
    if history.samples < config.min_samples:
        return "too few idle times"
    if history.out_of_range > config.max_out_of_range * history.samples:
        return "idle times beyond the histogram"
    n = len(history.bins)
    mean = history.in_range / n
    variance = history.square_sum / n - mean * mean
    if mean <= 0 or (max(variance, 0.0) ** 0.5) / mean < config.min_cv:
        return "histogram too flat"
    return ""


def histogram(config: PolicyConfig, history: History, now: int) -> Plan:
    why = representative(config, history)
    if why == "idle times beyond the histogram":
        return forecast(config, history, now)
    if why:
        return replace(fixed(config, history, now), why=f"fixed: {why}")
    head = _percentile_bin(history, config.head_percentile)  # idle minutes
    tail = _percentile_bin(history, config.tail_percentile)
    last = int(tail * (1 + config.margin)) + 2  # the call after ``tail`` idle minutes, +1
    first = int(head * (1 - config.margin)) + 1
    if first <= 1:
        return Plan(0, last, why="histogram")
    return Plan(first, last - first + 1, why="histogram")


def forecast(config: PolicyConfig, history: History, now: int) -> Plan:
    """Idle times past the histogram: when they are regular, expect the next to be like
    the recent ones, and be loaded from a margin before it to a margin after (two
    standard deviations of the recent idle times, at least 2% of the prediction);
    when they are not, a forecast would only keep memory busy: ``fixed``."""
    recent = list(history.recent_idle)
    if len(recent) < 2:
        return replace(fixed(config, history, now), why="fixed: nothing to forecast")
    mean = sum(recent) / len(recent)
    spread = (sum((x - mean) ** 2 for x in recent) / len(recent)) ** 0.5
    if mean <= 0 or spread / mean > config.max_forecast_cv:
        return replace(fixed(config, history, now), why="fixed: irregular long idle times")
    weights = range(1, len(recent) + 1)  # newer idle times count more
    predicted = sum(w * x for w, x in zip(weights, recent, strict=True)) / sum(weights)
    margin = max(2 * spread, 0.02 * predicted)
    first = max(int(predicted - margin), 1)  # the idle minutes before loading
    return Plan(first + 1, int(2 * margin) + 3, why="forecast")


def time_of_day(config: PolicyConfig, history: History, now: int) -> Plan | None:
    """Past days called at the same time of day within the lookahead: be loaded then.

    Bits for minutes later today are still clear, and those past midnight
    include today's, so counting every bit counts past days only.
    """
    if history.days_seen < config.min_days:
        return None  # not enough days to see a pattern
    found = np.flatnonzero(history.days_called_ahead(now, config.lookahead_min) >= config.min_days)
    if not len(found):
        return None
    d = int(found[0]) + 1
    if d <= config.keep_alive_min:
        return Plan(0, d + 1, why="time of day")
    return Plan(d - 1, 3, why="time of day")  # a minute early, for three


def trend_instances(config: PolicyConfig, history: History) -> int:
    """Instances to hold warm: one, more while the call rate climbs."""
    if history.slope_per_min <= config.rising_per_min:
        return 1
    extra = int(history.slope_per_min / config.rising_per_min)
    return max(1, min(1 + extra, config.max_instances))


def trend(config: PolicyConfig, history: History, now: int) -> Plan:
    instances = trend_instances(config, history)
    plan = fixed(config, history, now)
    return replace(plan, instances=instances, why="trend" if instances > 1 else "fixed")


def idle_counts(config: PolicyConfig, history: History) -> tuple[np.ndarray, float]:
    """How often the next call came ``d`` minutes after the last (index ``d``, from 0 to
    the histogram's range + 1), and how often later, each with ``prior_weight``
    pseudo-samples of a scale-free prior (``1/d`` over a day): a handful of idle times
    does not decide alone, and a function called once may well not be called again
    within the range."""
    size = len(history.bins) + 2
    counts = np.zeros(size)
    for i in history.nonzero:
        counts[i + 1] = history.bins[i]
    beyond = float(history.out_of_range)
    if config.prior_weight:
        prior = 1.0 / np.arange(1, max(config.prior_range_min, size - 1) + 1)
        prior *= config.prior_weight / prior.sum()
        counts[1 : size - 1] += prior[: size - 2]
        beyond += float(prior[size - 2 :].sum())
    return counts, beyond


@dataclass(frozen=True)
class Window:
    """The minutes ``first``..``last`` after a call to be loaded, and what they cost."""

    first: int
    last: int
    cost: float  # per idle period, in GB·min

    def plan(self, why: str) -> Plan:
        if self.last < self.first:
            return Plan(0, 0, why=why)  # unload at once, never pre-warm
        if self.first == 1:
            return Plan(0, self.last, why=why)
        return Plan(self.first, self.last - self.first + 1, why=why)


def best_window(
    counts: np.ndarray,
    beyond: float,
    memory_gb: float,
    cold_gb_min: float,
) -> Window:
    """The window of loaded minutes with the least expected cost, exactly.

    ``counts[d]``: idle periods whose next call came ``d`` minutes after the last one
    (``d`` up to ``len(counts) - 2``); ``beyond``: periods longer than that. Loaded for
    minutes ``a..b``, a call at ``d`` is warm when ``a <= d <= b`` and found the instance
    idle for ``clip(d - a, 0, b - a + 1)`` minutes, so the total cost is
    ``memory_gb * idle + cold_gb_min * cold``. With prefix sums ``N`` (counts) and ``S``
    (counts times ``d``) it splits into ``U(b) + V(a) + cold_gb_min * total``:

    - ``U(b) = m * (S[b+1] + (b+1) * (total - N[b+1])) - C * N[b]``
    - ``V(a) = m * (a * N[a] - S[a] - a * total) + C * N[a-1]``

    so the best ``b`` for each ``a`` is a suffix minimum of ``U``: linear in the range,
    not quadratic. Loading nothing (every call cold) is the last candidate.
    """
    top = len(counts) - 2  # the last minute a window may cover
    total = float(counts.sum()) + beyond
    n = np.cumsum(counts)
    s = np.cumsum(counts * np.arange(len(counts)))
    m, c = memory_gb, cold_gb_min
    d = np.arange(1, top + 1)
    u = m * (s[d + 1] + (d + 1) * (total - n[d + 1])) - c * n[d]
    v = m * (d * n[d] - s[d] - d * total) + c * n[d - 1]
    suffix = np.minimum.accumulate(u[::-1])[::-1]
    a = int(np.argmin(v + suffix))
    b = a + int(np.argmin(u[a:]))
    cost = float(v[a] + suffix[a]) + c * total
    nothing = c * total
    if nothing <= cost:
        return Window(1, 0, nothing / max(total, 1e-12))
    return Window(a + 1, b + 1, cost / max(total, 1e-12))


def expected_cost(
    config: PolicyConfig,
    history: History,
    plan: Plan,
    memory_gb: float = 1.0,
    counted: tuple[np.ndarray, float] | None = None,
) -> float:
    """Per idle period, in GB·min: the memory ``plan`` keeps loaded for nothing plus
    the price of its cold starts, over the idle times seen (and the prior; those past
    the histogram as long as the longest recent one)."""
    counts, beyond = counted if counted is not None else idle_counts(config, history)
    memory_gb = max(memory_gb, config.min_instance_gb)
    cold = config.cold_start_gb_min(memory_gb)
    d = np.arange(len(counts))
    idle = plan.idle_loaded_many(d)
    total = float((counts * (memory_gb * idle + cold * ~plan.warm_many(d))).sum())
    if beyond:
        long = max(max(history.recent_idle, default=0), len(history.bins)) + 1
        total += beyond * (
            memory_gb * plan.idle_loaded_min(long) + (0 if plan.warm(long) else cold)
        )
    return total / max(float(counts.sum()) + beyond, 1e-12)


def auto(config: PolicyConfig, history: History, now: int, memory_gb: float = 1.0) -> Plan:
    """The plan with the least expected cost at the configured price of a cold start:
    the best window of the idle-time distribution (:func:`best_window`), the forecast
    when idle times are mostly past the histogram, or the time-of-day prediction."""
    if not history.samples and not config.prior_weight:
        plan = replace(fixed(config, history, now), why="fixed: too few idle times")
    else:
        memory_gb = max(memory_gb, config.min_instance_gb)
        counted = idle_counts(config, history)
        window = best_window(*counted, memory_gb, config.cold_start_gb_min(memory_gb))
        plan = window.plan("cost")
        candidates = []
        if representative(config, history) == "idle times beyond the histogram":
            candidates.append(forecast(config, history, now))
        predicted = time_of_day(config, history, now)
        if predicted is not None:
            candidates.append(predicted)
        if candidates:
            cost = expected_cost(config, history, plan, memory_gb, counted)
            for candidate in candidates:
                other = expected_cost(config, history, candidate, memory_gb, counted)
                if other < cost:
                    plan, cost = candidate, other
    instances = trend_instances(config, history)
    return replace(plan, instances=instances) if instances > 1 else plan


@dataclass(frozen=True)
class Worth:
    """What holding a loaded instance is worth, minute by minute after its last call: the
    expected price of the cold start it saves per GB·minute it will yet be held
    (Greedy-Dual-Size-Frequency's cost * frequency / size, from the plan and the idle
    times seen instead of a count). The node's memory keeps the instances worth most
    when it is short: the server's budget and ``fnrt simulate --node-memory-gb`` both
    order evictions by :meth:`at`.

    ``below[d]``: idle periods (and prior) whose next call came at most ``d`` minutes
    after the last; ``below_d[d]``: the same weighted by ``d``; ``total``: all of them,
    those past the histogram included.
    """

    below: np.ndarray
    below_d: np.ndarray
    total: float
    first: int  # the plan's loaded minutes after the call
    last: int
    cold_gb_min: float
    memory_gb: float

    def at(self, idle_min: int) -> float:
        """Worth ``idle_min`` minutes after the last call (0 once the plan's window is past:
        the first to go)."""
        # the minutes wholly past: a call in this very minute is still to come (the node
        # evicts for a load before the other calls of its minute are served)
        e = max(int(idle_min), 0) - 1
        if e >= self.last:
            return 0.0
        top = len(self.below) - 1
        below, below_d = self.below, self.below_d

        def upto(array: np.ndarray, d: int) -> float:
            return float(array[min(d, top)]) if d >= 0 else 0.0

        rest = self.total - upto(below, e)  # periods still open after e minutes
        if rest <= 0:
            return 0.0
        start, end = max(self.first, e + 1), min(self.last, top)
        hit = float(below[end] - below[start - 1]) if end >= start else 0.0
        # minutes it is held from now: to the call when it falls in the window, else to
        # the window's end
        within = upto(below, self.last) - upto(below, e)
        called = upto(below_d, self.last) - upto(below_d, e) - e * within
        held = called + (rest - within) * (self.last - e)
        return hit * self.cold_gb_min / (self.memory_gb * max(held, rest, 1e-12))

    def about_to_serve(self, idle_min: int) -> bool:
        """Loaded ahead for its predicted call, and that call is due now: a pre-warm's
        instance that must not be evicted before the call it was loaded for."""
        return self.first > 1 and self.first <= idle_min + 1 <= self.last


def worth(
    config: PolicyConfig,
    history: History,
    plan: Plan,
    memory_gb: float = 1.0,
    *,
    cached: bool = False,
) -> Worth:
    """:class:`Worth` of an instance under ``plan``, from ``history`` (and the prior).
    ``cached``: the node keeps it past its plan while memory is free (a budget it
    fills): worth counts every call it may still catch, to the histogram's end."""
    counts, beyond = idle_counts(config, history)
    memory_gb = max(memory_gb, config.min_instance_gb)
    first, last = plan.loaded
    if cached:
        first, last = 1, len(counts) - 1
    return Worth(
        np.cumsum(counts),
        np.cumsum(counts * np.arange(len(counts))),
        float(counts.sum()) + beyond,
        first,
        last,
        config.cold_start_gb_min(memory_gb),
        memory_gb,
    )


def weigh(plan: Worth, idle_min: int, kept: Worth | None = None) -> tuple[float, bool]:
    """What keeping a loaded instance ``idle_min`` minutes after its last call is worth,
    and whether it must stay, as the node's memory decides evictions (the server's
    budget and ``fnrt simulate --node-memory-gb`` both ask here): its plan's worth
    while in its window (before a pre-warm's window: nothing, it comes back ahead);
    past it, when the node keeps instances in free memory (``kept``: their
    :func:`worth` with ``cached``), a worth far below any planned one, in the same
    order; a pre-warmed instance whose predicted call is due always stays."""
    e = max(int(idle_min), 0)
    value = plan.at(e) if e + 1 >= plan.first else 0.0
    if value <= 0 and kept is not None:
        value = kept.at(e) * 1e-9
    return value, plan.about_to_serve(e)


POLICIES = {
    Policy.FIXED: fixed,
    Policy.HISTOGRAM: histogram,
    Policy.TIME_OF_DAY: lambda c, h, n: time_of_day(c, h, n) or fixed(c, h, n),
    Policy.TREND: trend,
}


def decide(
    policy: Policy, config: PolicyConfig, history: History, now: int, memory_gb: float = 1.0
) -> Plan:
    """The plan after a call at minute ``now`` (already recorded in ``history``) for an
    instance of ``memory_gb`` (only ``auto`` prices memory)."""
    if policy is Policy.AUTO:
        return auto(config, history, now, memory_gb)
    return POLICIES[policy](config, history, now)
