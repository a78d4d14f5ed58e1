from __future__ import annotations

from fnrt.functions.manifest import BatchingConfig
from fnrt.runtime.batching import flush_delay_s


def test_full_batch_flushes_now() -> None:
    assert flush_delay_s(BatchingConfig(4, 10), queued=4, oldest_wait_s=0.0) == 0.0
    assert flush_delay_s(BatchingConfig(4, 10), queued=9, oldest_wait_s=0.0) == 0.0


def test_partial_batch_waits_out_the_oldest_requests_budget() -> None:
    cfg = BatchingConfig(8, 10)
    assert abs(flush_delay_s(cfg, queued=2, oldest_wait_s=0.004) - 0.006) < 1e-12  # type: ignore[operator]
    assert flush_delay_s(cfg, queued=2, oldest_wait_s=0.010) == 0.0
    assert flush_delay_s(cfg, queued=2, oldest_wait_s=0.5) == 0.0  # never later


def test_no_wait_configured_flushes_whatever_is_queued() -> None:
    assert flush_delay_s(BatchingConfig(8, 0), queued=1, oldest_wait_s=0.0) == 0.0


def test_empty_queue_has_nothing_to_flush() -> None:
    assert flush_delay_s(BatchingConfig(8, 5), queued=0, oldest_wait_s=0.0) is None
