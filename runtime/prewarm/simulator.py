"""Replay a trace through the keep-alive policies: cold starts against memory kept idle.

Each function is one instance (as in "Serverless in the Wild"), at minute
granularity: calls within a run of consecutive active minutes find it warm;
after a run, the policy's :class:`~fnrt.runtime.prewarm.policies.Plan` says
when it is loaded, and the next run's first call is cold unless it falls in
that window. The histories and plans are the runtime's own
(:class:`~fnrt.runtime.prewarm.history.History`,
:func:`~fnrt.runtime.prewarm.policies.decide`).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from fnrt.runtime.prewarm.history import History
from fnrt.runtime.prewarm.policies import Plan, Policy, PolicyConfig, decide
from fnrt.runtime.prewarm.trace import Trace, subset


@dataclass(frozen=True)
class Outcome:
    """One policy's result over a trace."""

    label: str
    invocations: int
    cold_starts: int
    cold_fraction_by_function: np.ndarray  # per function with calls
    idle_minutes: float  # instance-minutes loaded with no call
    idle_gb_minutes: float | None  # the same weighted by memory, when known
    prewarms: int
    prewarms_unused: int

    @property
    def cold_percent(self) -> float:
        return 100.0 * self.cold_starts / max(self.invocations, 1)

    def function_percentile(self, percentile: float) -> float:
        """Cold-start percentage of the function at ``percentile`` (75: the 75th)."""
        if not len(self.cold_fraction_by_function):
            return 0.0
        return 100.0 * float(np.percentile(self.cold_fraction_by_function, percentile))

    def row(self) -> dict[str, float | int | str | None]:
        return {
            "policy": self.label,
            "cold_%": round(self.cold_percent, 3),
            "p75_function_cold_%": round(self.function_percentile(75), 1),
            "idle_instance_min": round(self.idle_minutes),
            "idle_GB_min": round(self.idle_gb_minutes)
            if self.idle_gb_minutes is not None
            else None,
            "prewarms": self.prewarms,
            "prewarms_unused": self.prewarms_unused,
        }


def _runs(row: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """First minute, last minute and invocations of each run of active minutes."""
    active = np.flatnonzero(row)
    if not len(active):
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    breaks = np.flatnonzero(np.diff(active) > 1)
    firsts = active[np.concatenate(([0], breaks + 1))]
    lasts = active[np.concatenate((breaks, [len(active) - 1]))]
    sums = np.add.reduceat(row[active], np.concatenate(([0], breaks + 1)))
    return firsts, lasts, sums


@dataclass(frozen=True)
class _Job:
    label: str
    policy: Policy
    config: PolicyConfig


def mean_instance_gb(trace: Trace) -> float:
    """The mean instance of the functions called in ``trace`` (``auto``'s unit of price, as
    a node's is the mean of the functions it serves)."""
    memory_gb = trace.memory_mb / 1024 if trace.memory_mb is not None else None
    called = np.flatnonzero(trace.counts.any(axis=1))
    if not len(called):
        return 1.0
    return float(np.mean([_instance_gb(memory_gb, int(f)) for f in called]))


def simulate_one(trace: Trace, policy: Policy, config: PolicyConfig, label: str = "") -> Outcome:
    """Replay ``trace`` under one policy (``auto``'s mean instance: the trace's, unless
    ``config`` says)."""
    if config.mean_instance_gb is None:
        config = replace(config, mean_instance_gb=mean_instance_gb(trace))
    if policy is Policy.FIXED:
        return _simulate_constant(trace, decide(policy, config, History(), 0), label or "fixed")
    minutes = trace.minutes
    memory_gb = trace.memory_mb / 1024 if trace.memory_mb is not None else None
    cold_total = invocations_total = prewarms = unused = 0
    idle_total = 0.0
    idle_gb = 0.0
    fractions = []
    for f in range(trace.counts.shape[0]):
        firsts, lasts, sums = _runs(trace.counts[f])
        if not len(firsts):
            continue
        history = History()
        instance_gb = _instance_gb(memory_gb, f)
        cold = 1  # the first call of the trace
        idle = 0
        plan: Plan | None = None
        previous = 0
        for first, last, calls in zip(firsts.tolist(), lasts.tolist(), sums.tolist(), strict=True):
            if plan is not None:
                d = first - previous
                if not plan.warm(d):
                    cold += 1
                idle += plan.idle_loaded_min(d) * plan.instances
                if plan.prewarm_after_min:
                    start, end = plan.loaded
                    if d >= start:
                        prewarms += 1
                        unused += d > end
            history.record_run(first, last, calls)
            plan = decide(policy, config, history, last, instance_gb)
            previous = last
        if plan is not None:  # until the trace ends
            idle += plan.idle_loaded_min(minutes - previous) * plan.instances
        calls_total = int(sums.sum())
        cold_total += cold
        invocations_total += calls_total
        idle_total += idle
        if memory_gb is not None and not np.isnan(memory_gb[f]):
            idle_gb += idle * float(memory_gb[f])
        fractions.append(cold / calls_total)
    return Outcome(
        label or policy.value,
        invocations_total,
        cold_total,
        np.array(fractions),
        idle_total,
        idle_gb if memory_gb is not None else None,
        prewarms,
        unused,
    )


def _instance_gb(memory_gb: np.ndarray | None, f: int) -> float:
    """A function's memory for ``auto``'s prices: its app's, else 1 GB (so that without a
    memory file, GB·s read as instance-seconds)."""
    if memory_gb is None or np.isnan(memory_gb[f]):
        return 1.0
    return float(memory_gb[f])


def _simulate_constant(trace: Trace, plan: Plan, label: str) -> Outcome:
    """A plan that never changes (``fixed``), over every function at once with numpy."""
    counts = trace.counts
    rows, minutes_active = np.nonzero(counts)
    if not len(rows):
        return Outcome(label, 0, 0, np.zeros(0), 0.0, None, 0, 0)
    new_function = np.concatenate(([True], rows[1:] != rows[:-1]))
    gap = np.diff(minutes_active, prepend=0)
    gap[new_function] = 0  # a function's first active minute: no gap before it
    follows = ~new_function
    cold = new_function | (follows & (gap > 1) & ~plan.warm_many(gap))
    idle = np.where(follows & (gap > 1), plan.idle_loaded_many(gap), 0)
    last = np.concatenate((new_function[1:], [True]))  # a function's last active minute
    idle = idle + np.where(last, plan.idle_loaded_many(trace.minutes - minutes_active), 0)
    functions = np.flatnonzero(counts.any(axis=1))
    cold_by = np.bincount(rows, weights=cold, minlength=counts.shape[0])[functions]
    calls_by = counts.sum(axis=1)[functions]
    idle_by = np.bincount(rows, weights=idle, minlength=counts.shape[0])
    memory = trace.memory_mb
    idle_gb = None
    if memory is not None:
        known = ~np.isnan(memory)
        idle_gb = float((idle_by[known] * memory[known] / 1024).sum())
    return Outcome(
        label,
        int(calls_by.sum()),
        int(cold_by.sum()),
        cold_by / calls_by,
        float(idle_by.sum()),
        idle_gb,
        0,
        0,
    )


def _run_job(args: tuple[Trace, _Job]) -> Outcome:
    trace, job = args
    return simulate_one(trace, job.policy, job.config, job.label)


def _merge(parts: Sequence[Outcome]) -> Outcome:
    """One outcome from the outcomes of disjoint sets of functions."""
    gb = [p.idle_gb_minutes for p in parts]
    return Outcome(
        parts[0].label,
        sum(p.invocations for p in parts),
        sum(p.cold_starts for p in parts),
        np.concatenate([p.cold_fraction_by_function for p in parts]),
        sum(p.idle_minutes for p in parts),
        None if any(g is None for g in gb) else sum(g for g in gb if g is not None),
        sum(p.prewarms for p in parts),
        sum(p.prewarms_unused for p in parts),
    )


def simulate(
    trace: Trace,
    policies: Sequence[Policy],
    *,
    fixed_keep_alive_min: Sequence[int] = (10,),
    prices_gb_s: Sequence[float] = (),
    prices_mean_s: Sequence[float] = (),
    config: PolicyConfig | None = None,
    workers: int = 1,
) -> list[Outcome]:
    """Each policy over ``trace`` (``fixed`` once per keep-alive length, ``auto`` once per
    price of a cold start in ``prices_mean_s`` (seconds of the mean instance) and
    ``prices_gb_s``, default the config's), the functions split across ``workers``
    processes (the mean instance is the whole trace's)."""
    config = config or PolicyConfig()
    if config.mean_instance_gb is None:
        config = replace(config, mean_instance_gb=mean_instance_gb(trace))
    jobs: list[_Job] = []
    for policy in policies:
        if policy is Policy.FIXED:
            for minutes in fixed_keep_alive_min:
                jobs.append(
                    _Job(f"fixed {minutes} min", policy, replace(config, keep_alive_min=minutes))
                )
        elif policy is Policy.AUTO and (prices_gb_s or prices_mean_s):
            for price in prices_mean_s:
                priced = replace(
                    config,
                    cold_start_price_mean_s=price,
                    cold_start_price_gb_s=None,
                    cold_start_price_s=None,
                )
                jobs.append(_Job(auto_label_s(price), policy, priced))
            for price in prices_gb_s:
                priced = replace(config, cold_start_price_gb_s=price, cold_start_price_s=None)
                jobs.append(_Job(auto_label(price), policy, priced))
        else:
            jobs.append(_Job(policy.value, policy, config))
    if workers <= 1:
        return [_run_job((trace, job)) for job in jobs]
    # fixed runs vectorised in a moment; the others replay function by function, so
    # each is split into ``workers`` slices of the functions
    slices = [
        subset(trace, part.tolist())
        for part in np.array_split(np.arange(trace.counts.shape[0]), workers)
        if len(part)
    ]
    tasks = [(part, job) for job in jobs if job.policy is not Policy.FIXED for part in slices]
    by_label: dict[str, list[Outcome]] = {}
    with ProcessPoolExecutor(workers) as pool:
        pending = pool.map(_run_job, tasks)
        for job in jobs:  # fixed ones here, in numpy, while the pool works
            if job.policy is Policy.FIXED:
                by_label[job.label] = [_run_job((trace, job))]
        for outcome in pending:
            by_label.setdefault(outcome.label, []).append(outcome)
    return [_merge(by_label[job.label]) for job in jobs]


def auto_label(price_gb_s: float) -> str:
    """``auto 5,000 GB·s``: the label of ``auto`` at one price of a cold start."""
    return f"auto {price_gb_s:,.6g} GB·s"


def auto_label_s(price_mean_s: float) -> str:
    """``auto 4,000 s``: the label of ``auto`` at a price in seconds of the mean instance."""
    return f"auto {price_mean_s:,.6g} s"
