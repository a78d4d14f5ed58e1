"""Kept failures are bounded by count and by bytes."""

from __future__ import annotations

import numpy as np

from fnrt.functions.errors import HandlerFailed
from fnrt.functions.manifest import parse_manifest
from fnrt.runtime.clock import ManualClock
from fnrt.runtime.protection import Protection


def protection(**breaker: object) -> Protection:
    manifest = parse_manifest({"name": "f", "handler": "h:H", "breaker": breaker})
    return Protection(manifest, ManualClock())


def fail(p: Protection, size_bytes: int) -> None:
    inputs = {"x": np.zeros(size_bytes, dtype=np.uint8)}
    p.failed(0.0, 0.1, HandlerFailed("f", "e1", "boom"), inputs)


def test_the_oldest_go_first_past_the_count() -> None:
    p = protection(failed_inputs_kept=3)
    for size in (1, 2, 3, 4):
        fail(p, size)
    assert [f.inputs_bytes for f in p.failures] == [2, 3, 4]
    assert p.failure_bytes == 9


def test_the_oldest_go_first_past_the_bytes() -> None:
    p = protection(failed_inputs_bytes=1000)
    for _ in range(20):  # twenty failed 400-byte requests keep at most 1000 bytes
        fail(p, 400)
    assert len(p.failures) == 2 and p.failure_bytes == 800


def test_a_request_larger_than_the_bound_is_kept_without_its_inputs() -> None:
    p = protection(failed_inputs_bytes=1000)
    fail(p, 100)
    fail(p, 50_000_000)
    newest = p.failures[-1]
    assert newest.inputs is None and newest.inputs_bytes == 50_000_000
    assert p.failure_bytes == 100  # the smaller one stays
    assert newest.error["error_id"] == "e1"
