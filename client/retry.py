"""When a call is tried again: pure decisions, driven by the sync and async clients."""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

#: The statuses whose request the server never ran (queue full, not ready): safe to send
#: again for a call that is idempotent.
RETRIED_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class RetryPolicy:
    """How a client tries again after a 429 or 503, or a connection that never opened.

    ``attempts`` counts every try (1: never retry). Without a ``Retry-After`` the
    wait before try n+1 is a random share of ``backoff_s * 2**(n-1)`` (full jitter),
    at most ``backoff_max_s``. A ``Retry-After`` is honoured as given; one longer
    than ``max_wait_s`` ends the call with the error (it says how long to wait).
    """

    attempts: int = 4
    backoff_s: float = 0.1
    backoff_max_s: float = 2.0
    max_wait_s: float = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("RetryPolicy.attempts must be >= 1")
        if self.backoff_s < 0 or self.backoff_max_s < 0 or self.max_wait_s < 0:
            raise ValueError("RetryPolicy waits must be >= 0 seconds")


#: What a client does unless told otherwise.
DEFAULT_RETRY = RetryPolicy()
#: Every call tried once.
NO_RETRY = RetryPolicy(attempts=1)


def retry_after_s(value: str | None, now_s: Callable[[], float] = time.time) -> float | None:
    """A ``Retry-After`` header in seconds: delta-seconds or an HTTP date (None if absent)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now_s())


@dataclass
class Attempts:
    """The retry decisions of one call: how long to wait before the next try, or None."""

    policy: RetryPolicy
    idempotent: bool
    rng: random.Random
    tried: int = 0

    def after_status(self, status: int, retry_after: float | None) -> float | None:
        """After an answer with ``status``: seconds to wait, or None to finish with it."""
        self.tried += 1
        if status not in RETRIED_STATUSES:
            return None
        return self._wait(retry_after)

    def after_no_connection(self) -> float | None:
        """After a connection that never opened (nothing was sent)."""
        self.tried += 1
        return self._wait(None)

    def _wait(self, retry_after: float | None) -> float | None:
        if not self.idempotent or self.tried >= self.policy.attempts:
            return None
        if retry_after is not None:
            return retry_after if retry_after <= self.policy.max_wait_s else None
        ceiling = min(self.policy.backoff_max_s, self.policy.backoff_s * 2 ** (self.tried - 1))
        return self.rng.uniform(0, ceiling)
