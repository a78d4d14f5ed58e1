"""Finding by measurement how many instances of a function should share one device.

On a GPU, several instances (each with its own streams) keep the device busier
than one, up to a point past which they only queue on it and add latency. The
point depends on the model, so fnrt measures it: :func:`sweep` serves the
function at each level (that many instances, loaded before the clock starts),
drives it with a closed loop of clients through the real batcher, and reports
throughput and latency per level; :func:`best_level` picks one
(``fnrt bench-concurrency``, ``bench/gpu.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fnrt.functions.dtypes import numpy_dtype
from fnrt.functions.errors import FnrtError
from fnrt.functions.handler import Request
from fnrt.functions.manifest import Manifest
from fnrt.functions.version import VersionManifest
from fnrt.runtime import scheduler as sched
from fnrt.runtime.scheduler import Scheduler


@dataclass(frozen=True)
class SweepConfig:
    """The levels to try and the load each is measured under."""

    levels: tuple[int, ...] = (1, 2, 4, 8)
    clients: int = 64
    warmup_s: float = 2.0
    duration_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.levels or min(self.levels) < 1 or max(self.levels) > 256:
            raise ValueError("levels must be instance counts from 1 to 256")
        if self.clients < 1 or self.duration_s <= 0 or self.warmup_s < 0:
            raise ValueError("clients >= 1, duration_s > 0 and warmup_s >= 0")


@dataclass(frozen=True)
class LevelResult:
    """What one level served in its measured window."""

    level: int
    requests: int
    errors: int
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def throughput_rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "requests": self.requests,
            "errors": self.errors,
            "seconds": round(self.seconds, 3),
            "throughput_rps": round(self.throughput_rps, 1),
            "p50_ms": round(self.p50_ms, 3),
            "p99_ms": round(self.p99_ms, 3),
        }


def best_level(
    results: Sequence[LevelResult], p99_limit_ms: float | None = None, within: float = 0.02
) -> LevelResult | None:
    """The level to run at: the highest throughput among those that answered without
    errors (and within ``p99_limit_ms``, when given); a level within ``within`` of that
    throughput with fewer instances wins (it holds less memory for the same work)."""
    fit = [
        r
        for r in results
        if r.errors == 0 and r.requests and (p99_limit_ms is None or r.p99_ms <= p99_limit_ms)
    ]
    if not fit:
        return None
    top = max(r.throughput_rps for r in fit)
    return min((r for r in fit if r.throughput_rps >= top * (1 - within)), key=lambda r: r.level)


def at_level(vm: VersionManifest, level: int) -> VersionManifest:
    """``vm`` with exactly ``level`` instances (loaded as the load asks for them)."""
    scaling = replace(vm.manifest.scaling, min_instances=level, max_instances=level)
    return replace(vm, manifest=replace(vm.manifest, scaling=scaling))


def sample_request(manifest: Manifest, rows: int = 1, seed: int = 0) -> Request:
    """A request the manifest accepts: random values, ``rows`` where a dimension is -1."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray[Any, Any]] = {}
    for name, spec in manifest.inputs.items():
        shape = tuple(rows if d == -1 else d for d in spec.shape)
        dtype = numpy_dtype(spec.dtype)
        if dtype.kind == "f":
            out[name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            out[name] = rng.integers(0, 2, shape).astype(dtype)
        else:
            out[name] = np.zeros(shape, dtype)
    return out


async def measure(
    scheduler: Scheduler, level: int, request: Request, config: SweepConfig
) -> LevelResult:
    """Drive ``scheduler`` with ``config.clients`` closed-loop clients: first until its
    ``level`` instances are loaded and ``warmup_s`` has passed, then for ``duration_s``."""
    loop = asyncio.get_running_loop()
    await sched.warm(scheduler)
    latencies: list[float] = []
    errors = 0
    measuring = False
    stop = False

    async def client() -> None:
        nonlocal errors
        while not stop:
            start = time.perf_counter()
            try:
                await sched.submit(scheduler, request)
            except FnrtError:
                if measuring:
                    errors += 1
                continue
            if measuring:
                latencies.append(time.perf_counter() - start)

    clients = [asyncio.ensure_future(client()) for _ in range(config.clients)]
    try:
        deadline = loop.time() + config.warmup_s
        give_up = deadline + 120.0  # loads of a large model on a busy device
        while loop.time() < deadline or (
            len(scheduler.pool.loaded_instances()) < level and loop.time() < give_up
        ):
            await asyncio.sleep(0.05)
        measuring = True
        started = time.perf_counter()
        await asyncio.sleep(config.duration_s)
        measuring = False
        seconds = time.perf_counter() - started
    finally:
        stop = True
        await asyncio.gather(*clients, return_exceptions=True)
    ms = np.array(latencies) * 1e3 if latencies else np.zeros(1)
    return LevelResult(
        level,
        len(latencies),
        errors,
        seconds,
        float(np.percentile(ms, 50)),
        float(np.percentile(ms, 99)),
    )


async def sweep(
    make: Callable[[VersionManifest], Scheduler],
    vm: VersionManifest,
    request: Request,
    config: SweepConfig = SweepConfig(),
    progress: Callable[[LevelResult], None] | None = None,
) -> list[LevelResult]:
    """Measure ``vm`` at each level of ``config``, one level at a time, each on
    schedulers of its own (``make``), closed before the next level starts."""
    results = []
    for level in config.levels:
        scheduler = make(at_level(vm, level))
        try:
            result = await measure(scheduler, level, request, config)
        finally:
            await sched.close(scheduler)
        results.append(result)
        if progress is not None:
            progress(result)
    return results
