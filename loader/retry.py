"""Retrying transient failures with exponential backoff and full jitter."""

from __future__ import annotations

import random
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


def backoff_s(policy: RetryPolicy, attempt: int, rng: random.Random) -> float:
    """Delay before retry number ``attempt`` (1-based): uniform in [0, min(max, base * 2^(n-1))]."""
    ceiling = min(policy.max_delay_s, policy.base_delay_s * 2 ** (attempt - 1))
    return rng.uniform(0, ceiling)


def retrying(
    op: Callable[[], T],
    *,
    policy: RetryPolicy,
    transient: Callable[[BaseException], bool],
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> T:
    """Run ``op``; retry it while it raises transient errors and attempts remain.

    The last error is re-raised when the attempts run out.
    """
    rng = rng or random.Random()
    for attempt in range(1, policy.max_attempts + 1):
        try:
            return op()
        except Exception as exc:
            if attempt == policy.max_attempts or not transient(exc):
                raise
            sleep(backoff_s(policy, attempt, rng))
    raise AssertionError("unreachable")
