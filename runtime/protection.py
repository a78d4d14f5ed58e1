"""What the guards keep per function version: breaker, outcomes, caches, kept failures.

State only; the guards that read and write it are in ``guards.py``.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from fnrt.functions.errors import (
    CircuitOpen,
    DeadlineExceeded,
    FnrtError,
    HandlerFailed,
    LoadError,
)
from fnrt.functions.handler import Request
from fnrt.functions.manifest import Manifest
from fnrt.loader.instance import LoadTier
from fnrt.runtime.breaker import Breaker
from fnrt.runtime.clock import Clock
from fnrt.runtime.outcomes import OutcomeWindow
from fnrt.runtime.queue import Outputs
from fnrt.runtime.result_cache import ResultCache, SharedResults
from fnrt.runtime.stream import Stream

#: How long a last result is kept for the breaker's "cache" fallback.
LAST_RESULT_TTL_S = 24 * 3600.0

#: Failures on the server's side: they count against a version (breaker, canary).
SERVER_FAILURES = (HandlerFailed, LoadError, DeadlineExceeded)


@dataclass(slots=True)
class Served:
    """A request's outputs; the tier its instance was loaded from if it waited for a load.

    Slotted, not frozen: every request builds one, and a frozen dataclass takes
    about four times as long to build. Treat it as a value all the same."""

    outputs: Outputs
    cold_tier: LoadTier | None = None  # set when it waited for a load
    cached: bool = False  # answered from the result cache
    fallback: str | None = None  # "cache" or "function:NAME" when the breaker was open
    stream: Stream | None = None  # a generative function's answer, chunk by chunk
    finish: str | None = None  # why a generative answer, joined whole, ended


@dataclass(frozen=True)
class Failure:
    """A failed request kept for analysis: when, why, and its inputs."""

    at_unix_s: float
    error: dict[str, Any]
    inputs: Request | None  # None: larger than failed_inputs_bytes alone
    inputs_bytes: int = 0

    @property
    def kept_bytes(self) -> int:
        return self.inputs_bytes if self.inputs is not None else 0


def request_bytes(inputs: Request) -> int:
    """Bytes the arrays of a request hold (bytes elements by their lengths)."""
    total = 0
    for value in inputs.values():
        if isinstance(value, np.ndarray) and value.dtype.kind == "O":
            total += sum(len(item) for item in value.reshape(-1))
        else:
            total += int(getattr(value, "nbytes", 0))
    return total


class Protection:
    """One version's breaker, outcome window, result caches and kept failures."""

    #: The gateway's guards that apply to this version (chosen at its first call),
    #: and the same in reverse: the order they see outcomes in.
    guards: tuple[Any, ...] | None = None
    unwind: tuple[Any, ...] = ()

    def __init__(
        self, manifest: Manifest, clock: Clock, *, redis: Any = None, version: str = ""
    ) -> None:
        """``redis``: the node's shared Redis client, for ``backend = "redis"`` (None:
        the node has none, and such a version keeps a memory cache)."""
        caching = manifest.result_cache
        self.result_cache: ResultCache | SharedResults | None = None
        if caching.enabled and caching.backend == "redis" and redis is not None:
            prefix = f"fnrt:results:{manifest.name}:{version}:"
            self.result_cache = SharedResults(redis, prefix, caching.max_bytes, caching.ttl_s)
        elif caching.enabled:
            self.result_cache = ResultCache(caching.max_bytes, caching.ttl_s, clock)
        breaker = manifest.breaker
        self.breaker = Breaker(breaker)
        self.outcomes = OutcomeWindow()  # read by the canary judge (kept while it does)
        self.failures: deque[Failure] = deque()
        self._max_failures = breaker.failed_inputs_kept
        self._max_failure_bytes = breaker.failed_inputs_bytes
        self.failure_bytes = 0
        self.last_failure: str | None = None  # named by the open breaker's 503
        # The last result per input, answered while the breaker is open (fallback "cache").
        self.last_results = (
            ResultCache(breaker.cache_bytes, LAST_RESULT_TTL_S, clock)
            if breaker.fallback == "cache"
            else None
        )

    def succeeded(self, now: float, latency_s: float) -> None:
        self.outcomes.record(now, False, latency_s)
        self.breaker.record(now, False)

    def all_succeeded(self, now: float, latencies_s: list[float]) -> None:
        """A batch's requests served, each in its latency: counted at once."""
        self.outcomes.successes(now, latencies_s)
        self.breaker.record(now, False, len(latencies_s))

    def instance_lost(self, now: float, cause: str, retry_at: float, reason: str) -> bool:
        """An instance of the version died (``cause``, ``reason``), or its load failed on
        the handler's side; none loads again before ``retry_at``. True when that opened
        the breaker (the requests queued for it are then refused: :meth:`refusal`).
        An instance given up because its batch was cancelled did not die of itself."""
        if cause == "stopped":
            return False
        self.last_failure = reason
        return self.breaker.lost(now, retry_at)

    def refusal(self, function: str, version: str, now: float) -> CircuitOpen:
        """What a request gets while the breaker is open and no fallback answers:
        503, ``Retry-After`` the time until it may probe."""
        retry_after_s = self.breaker.retry_after_s(now)
        return CircuitOpen(function, version, retry_after_s, self.last_failure)

    def failed(self, now: float, latency_s: float, error: FnrtError, inputs: Request) -> None:
        """Count a server-side failure against the version and keep its inputs."""
        if not isinstance(error, SERVER_FAILURES):
            return
        self.last_failure = error.message
        self.outcomes.record(now, True, latency_s)
        self.breaker.record(now, True)
        if self._max_failures:
            self._keep(Failure(time.time(), error.to_dict(), inputs, request_bytes(inputs)))

    def _keep(self, failure: Failure) -> None:
        """Keep ``failure``, the oldest going first past the count or the bytes."""
        if failure.inputs_bytes > self._max_failure_bytes:  # alone past the bound
            failure = Failure(failure.at_unix_s, failure.error, None, failure.inputs_bytes)
        failures = self.failures
        while failures and (
            len(failures) >= self._max_failures
            or self.failure_bytes + failure.kept_bytes > self._max_failure_bytes
        ):
            self.failure_bytes -= failures.popleft().kept_bytes
        failures.append(failure)
        self.failure_bytes += failure.kept_bytes

    def describe(self, now: float) -> dict[str, Any]:
        return {
            "result_cache": self.result_cache.describe() if self.result_cache else None,
            "breaker": self.breaker.describe(now),
            "failures_kept": len(self.failures),
            "failures_kept_bytes": self.failure_bytes,
        }
