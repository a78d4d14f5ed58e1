"""Invocation traces written inline, for the tests of the trace simulators."""

from __future__ import annotations

import numpy as np

from fnrt.runtime.prewarm.trace import Trace


def made(calls: dict[str, list[int]], memory_mb: dict[str, float], minutes: int = 60) -> Trace:
    """A trace of ``minutes`` minutes: each function of ``calls`` called once in each of
    its minutes, with its memory from ``memory_mb``."""
    names = list(calls)
    counts = np.zeros((len(names), minutes), dtype=np.int32)
    for i, name in enumerate(names):
        counts[i, calls[name]] = 1
    memory = np.array([memory_mb[n] for n in names], dtype=float)
    return Trace(names, names, ["http"] * len(names), counts, memory)
