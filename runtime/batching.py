"""When a batch leaves the queue, and how big: pure decisions tested with plain numbers.

Fixed mode (:func:`flush_delay_s`): full, or the oldest request has waited
``max_wait_ms``. Adaptive mode (:func:`adaptive_plan`): learn the handler's
cost as ``per_item_s * n + fixed_s`` (:class:`CostModel`) and the arrival rate
(:class:`RateEstimator`), then pick the batch size and the wait that keep
queue wait + compute under ``target_p99_ms``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fnrt.functions.manifest import BatchingConfig


def flush_delay_s(config: BatchingConfig, queued: int, oldest_wait_s: float) -> float | None:
    """Seconds to wait before flushing; 0 to flush now, None when nothing is queued.

    A batch leaves when it is full or when its oldest request has waited
    ``max_wait_ms`` — never later.
    """
    if queued <= 0:
        return None
    if queued >= config.max_batch_size:
        return 0.0
    remaining = config.max_wait_ms / 1000.0 - oldest_wait_s
    return max(remaining, 0.0)


class CostModel:
    """Batch time as ``per_item_s * n + fixed_s``, a least-squares fit that forgets.

    Each observation's weight decays by ``decay`` per new one, so the fit
    follows a handler whose cost drifts (warm caches, other load).
    """

    def __init__(self, decay: float = 0.98) -> None:
        self.decay = decay
        self.count = 0
        self._w = self._n = self._nn = self._t = self._nt = 0.0

    def observe(self, n: int, seconds: float) -> None:
        d = self.decay
        self._w = self._w * d + 1
        self._n = self._n * d + n
        self._nn = self._nn * d + n * n
        self._t = self._t * d + seconds
        self._nt = self._nt * d + n * seconds
        self.count += 1

    @property
    def fitted(self) -> bool:
        return self.count >= 3

    def coefficients(self) -> tuple[float, float]:
        """(per_item_s, fixed_s), both >= 0."""
        if self._w == 0:
            return 0.0, 0.0
        mean_n, mean_t = self._n / self._w, self._t / self._w
        var_n = self._nn / self._w - mean_n**2
        if var_n < 1e-9:  # every batch the same size: all cost is per item
            return mean_t / max(mean_n, 1.0), 0.0
        slope = (self._nt / self._w - mean_n * mean_t) / var_n
        slope = max(slope, 0.0)
        fixed = max(mean_t - slope * mean_n, 0.0)
        return slope, fixed

    def predict(self, n: int) -> float:
        per_item, fixed = self.coefficients()
        return per_item * n + fixed


class RateEstimator:
    """Arrivals per second from an exponentially weighted mean of inter-arrival gaps."""

    def __init__(self, weight: float = 0.1) -> None:
        self.weight = weight
        self._gap_s: float | None = None
        self._last: float | None = None

    def arrive(self, now: float) -> None:
        if self._last is not None:
            gap = max(now - self._last, 1e-6)
            self._gap_s = (
                gap if self._gap_s is None else (1 - self.weight) * self._gap_s + self.weight * gap
            )
        self._last = now

    def rate_per_s(self, now: float) -> float:
        """The estimate, lowered when the time since the last arrival says arrivals slowed."""
        if self._gap_s is None or self._last is None:
            return 0.0
        return 1.0 / max(self._gap_s, now - self._last)


@dataclass(frozen=True)
class Plan:
    """Flush now with up to ``size`` requests (``wait_s == 0``), or wait ``wait_s`` first."""

    size: int
    wait_s: float


def largest_batch_within(config: BatchingConfig, cost: CostModel, budget_s: float) -> int:
    """The biggest batch (>= 1, <= max_batch_size) whose predicted compute fits ``budget_s``."""
    per_item, fixed = cost.coefficients()
    if per_item <= 0:
        return config.max_batch_size
    return max(1, min(config.max_batch_size, math.floor((budget_s - fixed) / per_item)))


def adaptive_plan(
    config: BatchingConfig, cost: CostModel, rate_per_s: float, queued: int, oldest_wait_s: float
) -> Plan:
    """Size and wait for the next batch under ``target_p99_ms``.

    Batches may take up to half the target in compute; the rest is for queueing.
    A full batch (or a long queue) leaves at once. A partial one waits for more
    arrivals only while the oldest request can still finish in time, and not at
    all when arrivals are too sparse to fill it within that slack.
    """
    if not cost.fitted:
        return Plan(config.max_batch_size, flush_delay_s(config, queued, oldest_wait_s) or 0.0)
    target = config.target_p99_ms / 1000.0
    size = largest_batch_within(config, cost, target / 2)
    if queued >= size:
        return Plan(size, 0.0)
    slack = target - oldest_wait_s - cost.predict(size)
    if config.max_wait_ms > 0:
        slack = min(slack, config.max_wait_ms / 1000.0 - oldest_wait_s)
    if rate_per_s <= 0 or slack <= 0:
        return Plan(size, 0.0)
    fill_s = (size - queued) / rate_per_s
    if 1.0 / rate_per_s > slack:  # not even one more arrival is expected in time
        return Plan(size, 0.0)
    return Plan(size, min(fill_s, slack))


def predicted_finish_s(
    config: BatchingConfig, cost: CostModel, queued_ahead: int, instances: int
) -> float:
    """Seconds until a request that joins the queue now is answered (adaptive mode)."""
    if not cost.fitted:
        return 0.0
    size = largest_batch_within(config, cost, config.target_p99_ms / 2000.0)
    batches = math.ceil((queued_ahead + 1) / size)
    rounds = math.ceil(batches / max(instances, 1))
    return rounds * cost.predict(size)


def may_send_ahead(
    earliest_deadline: float | None, now: float, running_left_s: float | None
) -> bool:
    """Whether a batch may be sent (or staged) ahead, to run the moment the batch
    computing now ends, with no further look at its requests' deadlines.

    Only when none of them can pass before then: ``earliest_deadline`` (the soonest
    of the requests it would take; None: none has one) later than ``now`` plus
    ``running_left_s``, what the batch computing is predicted still to take (None:
    no prediction yet, so a request with a deadline waits in the queue, where its
    deadline is watched and it is answered 504 on time)."""
    if earliest_deadline is None:
        return True
    if running_left_s is None:
        return False
    return earliest_deadline > now + running_left_s


#: While live requests arrive, a batch of job records alone is followed by a pause
#: this many times its length (a live request ends it at once): jobs take at most
#: ``1 / (1 + JOB_YIELD)`` of an instance's time from live traffic, and all of it
#: when there is none.
JOB_YIELD = 4.0
#: Live arrivals per second under which an instance counts as idle for jobs.
LIVE_RATE_PER_S = 1.0


def job_pause_s(batch_s: float, live_rate_per_s: float, yield_factor: float = JOB_YIELD) -> float:
    """How long a slot waits, after a batch of job records only, before it takes the
    next: none when no live request came lately (jobs may take the whole instance)."""
    if live_rate_per_s < LIVE_RATE_PER_S:
        return 0.0
    return batch_s * yield_factor
