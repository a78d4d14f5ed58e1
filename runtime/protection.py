"""What the guards keep per function version: breaker, outcomes, caches, kept failures.

State only; the guards that read and write it are in ``guards.py``.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from fnrt.functions.errors import DeadlineExceeded, FnrtError, HandlerFailed, LoadError
from fnrt.functions.handler import Request
from fnrt.functions.manifest import Manifest
from fnrt.loader.instance import LoadTier
from fnrt.runtime.breaker import Breaker
from fnrt.runtime.clock import Clock
from fnrt.runtime.outcomes import OutcomeWindow
from fnrt.runtime.queue import Outputs
from fnrt.runtime.result_cache import ResultCache

#: How long a last result is kept for the breaker's "cache" fallback.
LAST_RESULT_TTL_S = 24 * 3600.0

#: Failures on the server's side: they count against a version (breaker, canary).
SERVER_FAILURES = (HandlerFailed, LoadError, DeadlineExceeded)


@dataclass(frozen=True)
class Served:
    """A request's outputs; the tier its instance was loaded from if it waited for a load."""

    outputs: Outputs
    cold_tier: LoadTier | None = None  # set when it waited for a load
    cached: bool = False  # answered from the result cache
    fallback: str | None = None  # "cache" or "function:NAME" when the breaker was open


@dataclass(frozen=True)
class Failure:
    """A failed request kept for analysis: when, why, and its inputs."""

    at_unix_s: float
    error: dict[str, Any]
    inputs: Request


class Protection:
    """One version's breaker, outcome window, result caches and kept failures."""

    #: The gateway's guards that apply to this version (chosen at its first call),
    #: and the same in reverse: the order they see outcomes in.
    guards: tuple[Any, ...] | None = None
    unwind: tuple[Any, ...] = ()

    def __init__(self, manifest: Manifest, clock: Clock) -> None:
        caching = manifest.result_cache
        self.result_cache = (
            ResultCache(caching.max_bytes, caching.ttl_s, clock) if caching.enabled else None
        )
        breaker = manifest.breaker
        self.breaker = Breaker(breaker)
        self.outcomes = OutcomeWindow()  # read by the canary judge
        self.failures: deque[Failure] = deque(maxlen=breaker.failed_inputs_kept)
        # The last result per input, answered while the breaker is open (fallback "cache").
        self.last_results = (
            ResultCache(breaker.cache_bytes, LAST_RESULT_TTL_S, clock)
            if breaker.fallback == "cache"
            else None
        )

    def succeeded(self, now: float, latency_s: float) -> None:
        self.outcomes.record(now, False, latency_s)
        self.breaker.record(now, False)

    def failed(self, now: float, latency_s: float, error: FnrtError, inputs: Request) -> None:
        """Count a server-side failure against the version and keep its inputs."""
        if not isinstance(error, SERVER_FAILURES):
            return
        self.outcomes.record(now, True, latency_s)
        self.breaker.record(now, True)
        if self.failures.maxlen:
            self.failures.append(Failure(time.time(), error.to_dict(), inputs))

    def describe(self, now: float) -> dict[str, Any]:
        return {
            "result_cache": self.result_cache.describe() if self.result_cache else None,
            "breaker": self.breaker.describe(now),
            "failures_kept": len(self.failures),
        }
