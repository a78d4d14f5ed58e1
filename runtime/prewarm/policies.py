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
- ``auto`` (the default): of the plans the history supports (fixed, the
  histogram's or its forecast, time of day), the one with the lowest
  expected cost over the idle times seen, a cold start weighing
  ``cold_start_cost_min`` minutes of idle memory; trend decides the
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
    cold_start_cost_min: float = 10.0  # auto: a cold start weighs this many idle minutes

    def __post_init__(self) -> None:
        if self.keep_alive_min < 0:
            raise ValueError("keep_alive_min: must be >= 0")
        if not 0 <= self.head_percentile < self.tail_percentile <= 100:
            raise ValueError("head_percentile, tail_percentile: need 0 <= head < tail <= 100")
        if not 0 <= self.margin < 1:
            raise ValueError("margin: must be a fraction from 0 to 1")
        if self.min_samples < 1 or self.min_days < 1 or self.lookahead_min < 1:
            raise ValueError("min_samples, min_days, lookahead_min: must be >= 1")


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
    for d in range(1, config.lookahead_min + 1):
        if history.called_on_days(now + d) >= config.min_days:
            if d <= config.keep_alive_min:
                return Plan(0, d + 1, why="time of day")
            return Plan(d - 1, 3, why="time of day")  # a minute early, for three
    return None


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


def expected_cost(config: PolicyConfig, history: History, plan: Plan) -> float:
    """Per idle period, the minutes ``plan`` would keep an instance loaded for nothing,
    plus ``cold_start_cost_min`` for each cold start, over the idle times seen so far."""
    bins = history.bins
    total = 0.0
    for i in history.nonzero:
        d = i + 1
        total += bins[i] * (
            plan.idle_loaded_min(d) + (0 if plan.warm(d) else config.cold_start_cost_min)
        )
    if history.out_of_range:
        long = max(max(history.recent_idle, default=0), len(bins)) + 1
        total += history.out_of_range * (
            plan.idle_loaded_min(long) + (0 if plan.warm(long) else config.cold_start_cost_min)
        )
    return total / max(history.samples, 1)


def auto(config: PolicyConfig, history: History, now: int) -> Plan:
    """The cheapest of the plans the history supports (``expected_cost``): the
    histogram's (or its forecast), the time-of-day prediction, or ``fixed``."""
    candidates = [fixed(config, history, now)]
    why = representative(config, history)
    if not why or why == "idle times beyond the histogram":
        candidates.append(histogram(config, history, now))
    predicted = time_of_day(config, history, now)
    if predicted is not None:
        candidates.append(predicted)
    plan = candidates[0]
    if len(candidates) > 1 and history.samples:
        plan = min(candidates, key=lambda p: expected_cost(config, history, p))
    if plan is candidates[0] and why:
        plan = replace(plan, why=f"fixed: {why}")
    instances = trend_instances(config, history)
    return replace(plan, instances=instances) if instances > 1 else plan


POLICIES = {
    Policy.FIXED: fixed,
    Policy.HISTOGRAM: histogram,
    Policy.TIME_OF_DAY: lambda c, h, n: time_of_day(c, h, n) or fixed(c, h, n),
    Policy.TREND: trend,
    Policy.AUTO: auto,
}


def decide(policy: Policy, config: PolicyConfig, history: History, now: int) -> Plan:
    """The plan after a call at minute ``now`` (already recorded in ``history``)."""
    return POLICIES[policy](config, history, now)
