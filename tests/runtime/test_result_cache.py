from __future__ import annotations

import asyncio

import numpy as np
import pytest

from fnrt.runtime.clock import ManualClock
from fnrt.runtime.result_cache import ResultCache, SharedResults, inputs_key


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


class _Redis:
    """A redis client whose GET answers when the test says."""

    def __init__(self) -> None:
        self.answer: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()

    async def get(self, key: str) -> bytes | None:
        return await self.answer


def test_a_shared_lookup_cancelled_as_redis_answers_is_cancelled() -> None:
    """A request cancelled in the same turn as Redis answers its lookup is cancelled (on
    Python 3.11 ``asyncio.wait_for`` returned the answer instead, and the request ran on)."""

    async def scenario() -> None:
        redis = _Redis()
        shared = SharedResults(redis, "fnrt:t:", max_bytes=1 << 20, ttl_s=60)
        looking = asyncio.ensure_future(shared.get("k"))
        for _ in range(3):
            await asyncio.sleep(0)  # it awaits Redis
        redis.answer.set_result(None)
        looking.cancel()  # in the same turn
        with pytest.raises(asyncio.CancelledError):
            await looking

    asyncio.run(scenario())
