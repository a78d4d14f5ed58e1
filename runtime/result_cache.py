"""An opt-in cache of a function's outputs by a hash of its inputs (deterministic handlers).

In memory (``ResultCache``): bounded in bytes (least recently used entries go
first) and by age (``ttl_s``). In Redis (``SharedResults``): one cache every
node shares, entries expiring after ``ttl_s``. A hit is answered without
touching the queue.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

from fnrt.functions.codec import decode_msgpack, encode_msgpack
from fnrt.functions.extras import require
from fnrt.functions.limits import UNBOUNDED
from fnrt.runtime.clock import Clock

log = logging.getLogger("fnrt.result_cache")

Outputs = dict[str, np.ndarray[Any, Any]]


def inputs_key(inputs: Mapping[str, np.ndarray[Any, Any]]) -> str:
    """A digest of every input's name, dtype, shape and bytes."""
    h = hashlib.blake2b(digest_size=20)
    for name in sorted(inputs):
        array = np.ascontiguousarray(inputs[name])
        h.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        if array.dtype == object:  # a bytes tensor: each element, length first
            for item in array.reshape(-1):
                h.update(len(item).to_bytes(8, "little"))
                h.update(item)
        else:
            h.update(array.data.cast("B") if array.size else b"")
    return h.hexdigest()


class ResultCache:
    def __init__(self, max_bytes: int, ttl_s: float, clock: Clock) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, int, Outputs]] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> Outputs | None:
        entry = self._entries.get(key)
        if entry is None or self._clock.now() - entry[0] >= self.ttl_s:
            if entry is not None:
                self._drop(key)
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry[2]

    def put(self, key: str, outputs: Outputs) -> None:
        size = sum(a.nbytes for a in outputs.values())
        if size > self.max_bytes:
            return
        if key in self._entries:
            self._drop(key)
        while self._entries and self.bytes + size > self.max_bytes:
            self._drop(next(iter(self._entries)))
        self._entries[key] = (self._clock.now(), size, outputs)
        self.bytes += size

    def _drop(self, key: str) -> None:
        _, size, _ = self._entries.pop(key)
        self.bytes -= size

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "memory",
            "entries": len(self._entries),
            "bytes": self.bytes,
            "hits": self.hits,
            "misses": self.misses,
        }


#: How long a Redis command may take before the cache is skipped for this call.
REDIS_TIMEOUT_S = 0.25
#: After a Redis failure, calls skip the cache this long before trying it again.
REDIS_RETRY_S = 1.0


class SharedResults:
    """A version's results in the Redis every node shares: ``get`` and ``put``
    never raise. A failure (Redis down, slow, restarting) is counted, the call is
    served uncached, and the cache is skipped for ``REDIS_RETRY_S``."""

    def __init__(self, redis: Any, prefix: str, max_bytes: int, ttl_s: float) -> None:
        self._redis = redis
        self._prefix = prefix
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._skip_until = 0.0
        self._writes: set[asyncio.Task[None]] = set()
        self.hits = 0
        self.misses = 0
        self.errors = 0
        self.last_error = ""

    def _usable(self) -> bool:
        return time.monotonic() >= self._skip_until

    def _failed(self, exc: BaseException) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        if self._usable():
            log.warning("result cache %s: redis failed (%s); serving uncached", self._prefix, exc)
        self._skip_until = time.monotonic() + REDIS_RETRY_S

    async def get(self, key: str) -> Outputs | None:
        if not self._usable():
            self.misses += 1
            return None
        try:
            async with asyncio.timeout(REDIS_TIMEOUT_S):
                data = await self._redis.get(self._prefix + key)
            found = decode_msgpack(data, UNBOUNDED) if data is not None else None
        except Exception as exc:  # never a request error
            self._failed(exc)
            found = None
        if found is None:
            self.misses += 1
            return None
        self.hits += 1
        return found

    def put(self, key: str, outputs: Outputs) -> None:
        """Store in the background: the answer does not wait for Redis."""
        if not self._usable() or sum(a.nbytes for a in outputs.values()) > self.max_bytes:
            return
        task = asyncio.ensure_future(self._put(key, outputs))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _put(self, key: str, outputs: Outputs) -> None:
        try:
            body = encode_msgpack(outputs)
            ttl_ms = max(int(self.ttl_s * 1000), 1)
            async with asyncio.timeout(REDIS_TIMEOUT_S):
                await self._redis.set(self._prefix + key, body, px=ttl_ms)
        except Exception as exc:
            self._failed(exc)

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "redis",
            "hits": self.hits,
            "misses": self.misses,
            "errors": self.errors,
            "last_error": self.last_error,
        }


def redis_client(url: str) -> Any:
    """An asyncio Redis client for ``url`` (connections made at first use)."""
    aioredis = require("redis.asyncio", "the shared result cache (--redis-url)")
    return aioredis.Redis.from_url(
        url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
    )
