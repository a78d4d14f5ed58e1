from __future__ import annotations

import numpy as np

from fnrt.runtime.clock import ManualClock
from fnrt.runtime.result_cache import ResultCache, inputs_key


def test_key_covers_names_dtypes_shapes_and_bytes() -> None:
    x = np.arange(4, dtype=np.float32)
    assert inputs_key({"x": x}) == inputs_key({"x": x.copy()})
    assert inputs_key({"x": x}) != inputs_key({"y": x})
    assert inputs_key({"x": x}) != inputs_key({"x": x.astype(np.float64)})
    assert inputs_key({"x": x}) != inputs_key({"x": x.reshape(2, 2)})


def test_ttl_and_byte_bound() -> None:
    clock = ManualClock()
    cache = ResultCache(max_bytes=100, ttl_s=10, clock=clock)
    out = {"y": np.zeros(10, np.float32)}  # 40 bytes
    cache.put("a", out)
    cache.put("b", out)
    assert cache.get("a") is out
    cache.put("c", out)  # 120 > 100: the least recently used ("b") goes
    assert cache.get("b") is None and cache.get("c") is out and cache.bytes == 80
    clock.advance(10)
    assert cache.get("a") is None and cache.bytes == 40
    cache.put("huge", {"y": np.zeros(100, np.float32)})  # never fits: not kept
    assert cache.get("huge") is None
