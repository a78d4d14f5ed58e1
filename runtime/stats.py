"""Counters, cumulative durations and recent-latency summaries of one function version.

``GET /v1/functions/{name}`` shows the summaries; ``GET /v2/models/{m}/stats``
shows the cumulative totals in Triton's shape.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fnrt.loader.instance import LoadTier


class Window:
    """The last ``size`` samples of a duration, summarised as mean, p50, p99 (milliseconds)."""

    def __init__(self, size: int = 2048) -> None:
        self._samples: deque[float] = deque(maxlen=size)

    def add(self, seconds: float) -> None:
        self._samples.append(seconds)

    def extend(self, seconds: Iterable[float]) -> None:
        self._samples.extend(seconds)

    def summary(self) -> dict[str, float]:
        if not self._samples:
            return {"count": 0}
        ordered = sorted(self._samples)

        def q(p: float) -> float:
            return round(ordered[min(int(p * len(ordered)), len(ordered) - 1)] * 1000, 3)

        return {
            "count": len(ordered),
            "mean_ms": round(sum(ordered) / len(ordered) * 1000, 3),
            "p50_ms": q(0.50),
            "p99_ms": q(0.99),
        }


@dataclass
class Total:
    """How many times something happened and how long it took in all."""

    count: int = 0
    seconds: float = 0.0

    def add(self, seconds: float, count: int = 1) -> None:
        self.count += count
        self.seconds += seconds

    def to_triton(self) -> dict[str, int]:
        return {"count": self.count, "ns": int(self.seconds * 1e9)}


@dataclass
class BatchTotals:
    """Per batch size: the time to hand inputs over, run the handler, check outputs."""

    compute_input: Total = field(default_factory=Total)
    compute_infer: Total = field(default_factory=Total)
    compute_output: Total = field(default_factory=Total)


@dataclass
class Totals:
    """Cumulative durations since the version was first served (Triton's statistics)."""

    success: Total = field(default_factory=Total)  # end to end, request admitted -> answered
    fail: Total = field(default_factory=Total)
    queue: Total = field(default_factory=Total)
    compute_input: Total = field(default_factory=Total)  # per request, its batch's time
    compute_infer: Total = field(default_factory=Total)
    compute_output: Total = field(default_factory=Total)
    cache_hit: Total = field(default_factory=Total)
    cache_miss: Total = field(default_factory=Total)
    by_batch_size: dict[int, BatchTotals] = field(default_factory=dict)
    last_request_unix_s: float = 0.0

    def batch(self, size: int, input_s: float, infer_s: float, output_s: float) -> None:
        """Record one batch of ``size`` requests."""
        self.compute_input.add(input_s * size, size)
        self.compute_infer.add(infer_s * size, size)
        self.compute_output.add(output_s * size, size)
        per_size = self.by_batch_size.get(size)
        if per_size is None:  # (not setdefault: that would build one every batch)
            per_size = self.by_batch_size[size] = BatchTotals()
        per_size.compute_input.add(input_s)
        per_size.compute_infer.add(infer_s)
        per_size.compute_output.add(output_s)


@dataclass
class Stats:
    requests: int = 0
    errors: int = 0
    rejected: int = 0  # 429 / 503 at admission
    expired: int = 0  # 504: deadline passed while queued
    abandoned: int = 0  # 499: the client left while queued (never computed)
    batches: int = 0
    loads: int = 0
    load_failures: int = 0
    unloads: int = 0
    last_load_timings_s: dict[str, float] = field(default_factory=dict)
    last_load_tier: LoadTier | None = None
    last_load_bytes: int = 0
    last_load_device_bytes: int = 0
    last_load_error: str | None = None  # the last load's failure, until a load succeeds
    cold_starts: Counter[str] = field(default_factory=Counter)
    batch_sizes: Counter[int] = field(default_factory=Counter)
    queue_wait: Window = field(default_factory=Window)
    compute: Window = field(default_factory=Window)
    totals: Totals = field(default_factory=Totals)
    starts: Counter[str] = field(default_factory=Counter)  # warm / prewarmed / cold
    prewarms: Counter[str] = field(default_factory=Counter)  # hit / miss
    last_prewarm_lead_s: float | None = None  # how long before its first call it was ready
    restarts: Counter[str] = field(default_factory=Counter)  # instances lost, by cause
    last_restart_reason: str | None = None

    def expected_bytes(self, size_bytes: int, worker_bytes: int = 0) -> tuple[int, int]:
        """What the version's next load will hold in host and device memory: its last
        load's, or until one has loaded ``size_bytes`` (the version's) on either, and
        ``worker_bytes`` (a worker process's own, ``launch.worker_bytes``) in host memory.
        A measured 0 is 0: a model wholly on the GPU holds no host memory, nor one on
        the CPU the GPU's."""
        if self.loads:
            return self.last_load_bytes, self.last_load_device_bytes
        return size_bytes + worker_bytes, size_bytes

    def describe(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "rejected": self.rejected,
            "expired": self.expired,
            "abandoned": self.abandoned,
            "batches": self.batches,
            "loads": self.loads,
            "load_failures": self.load_failures,
            "unloads": self.unloads,
            "last_load_tier": self.last_load_tier,
            "last_load_error": self.last_load_error,
            "last_load_timings_s": {k: round(v, 6) for k, v in self.last_load_timings_s.items()},
            "cold_starts": dict(self.cold_starts),
            "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
            "queue_wait": self.queue_wait.summary(),
            "compute": self.compute.summary(),
            "starts": {k: self.starts[k] for k in ("warm", "prewarmed", "cold")},
            "prewarms": {k: self.prewarms[k] for k in ("hit", "miss")},
            "last_prewarm_lead_s": (
                round(self.last_prewarm_lead_s, 3) if self.last_prewarm_lead_s is not None else None
            ),
            "restarts": dict(self.restarts),
            "last_restart_reason": self.last_restart_reason,
        }
