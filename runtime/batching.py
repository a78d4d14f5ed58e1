"""When a batch leaves the queue: a pure decision, tested with plain numbers."""

from __future__ import annotations

from fnrt.functions.manifest import BatchingConfig


def flush_delay_s(config: BatchingConfig, queued: int, oldest_wait_s: float) -> float | None:
    """Seconds to wait before flushing; 0 to flush now, None when nothing is queued.

    A batch leaves when it is full or when its oldest request has waited
    ``max_wait_ms`` — never later.
    """
    if queued <= 0:
        return None
    if queued >= config.max_batch_size:
        return 0.0
    remaining = config.max_wait_ms / 1000.0 - oldest_wait_s
    return max(remaining, 0.0)
