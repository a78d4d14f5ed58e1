"""Retrying transient failures with exponential backoff and full jitter, within a deadline."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry one operation."""

    max_attempts: int = 5
    base_delay_s: float = 0.2
    max_delay_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts: must be at least 1")
        if self.base_delay_s < 0 or self.max_delay_s < self.base_delay_s:
            raise ValueError("base_delay_s and max_delay_s: need 0 <= base <= max")


class Deadline:
    """When an operation must have ended: ``idle_s`` after it started or last made
    progress (:meth:`progressed`: bytes arrived), and never later than ``total_s``
    after it started (None: no such bound). Threads may share one (the parts of a
    download)."""

    def __init__(
        self,
        idle_s: float,
        total_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle_s = idle_s
        self.total_s = total_s
        self._clock = clock
        self.started = self._last = clock()
        self._lock = threading.Lock()

    def progressed(self) -> None:
        with self._lock:
            self._last = self._clock()

    def left_s(self) -> float:
        """Seconds left before the deadline (negative once it passed)."""
        now = self._clock()
        with self._lock:
            end = self._last + self.idle_s
        if self.total_s is not None:
            end = min(end, self.started + self.total_s)
        return end - now

    def elapsed_s(self) -> float:
        return self._clock() - self.started


def backoff_s(policy: RetryPolicy, attempt: int, rng: random.Random) -> float:
    """Delay before retry number ``attempt`` (1-based): uniform in [0, min(max, base * 2^(n-1))]."""
    ceiling = min(policy.max_delay_s, policy.base_delay_s * 2 ** (attempt - 1))
    return rng.uniform(0, ceiling)


def may_retry(left_s: float, wait_s: float, attempt_s: float) -> bool:
    """Whether a retry after ``wait_s`` still fits a deadline ``left_s`` away when one
    attempt may take ``attempt_s`` to fail (a connect timeout plus a read timeout): a
    retry that could only fail past the deadline is not started."""
    return left_s - wait_s >= attempt_s


def retrying(
    op: Callable[[], T],
    *,
    policy: RetryPolicy,
    transient: Callable[[BaseException], bool],
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
    deadline: Deadline | None = None,
    attempt_s: float = 0.0,
) -> T:
    """Run ``op``; retry it while it raises transient errors, attempts remain and
    (given a ``deadline``) a retry taking ``attempt_s`` to fail would end before it.

    The last error is re-raised when the attempts or the time run out.
    """
    rng = rng or random.Random()
    for attempt in range(1, policy.max_attempts + 1):
        try:
            return op()
        except Exception as exc:
            if attempt == policy.max_attempts or not transient(exc):
                raise
            wait = backoff_s(policy, attempt, rng)
            if deadline is not None and not may_retry(deadline.left_s(), wait, attempt_s):
                raise
            sleep(wait)
    raise AssertionError("unreachable")
