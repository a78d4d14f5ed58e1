"""An opt-in cache of a function's outputs by a hash of its inputs (deterministic handlers).

Bounded in bytes (least recently used entries go first) and by age (``ttl_s``).
A hit is answered without touching the queue.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

from fnrt.runtime.clock import Clock

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
            "entries": len(self._entries),
            "bytes": self.bytes,
            "hits": self.hits,
            "misses": self.misses,
        }
