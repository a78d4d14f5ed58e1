from __future__ import annotations

from fnrt.runtime.outcomes import OutcomeWindow, p99


def test_p99_is_the_nearest_rank() -> None:
    assert p99([]) == 0.0
    assert p99([0.5]) == 0.5
    assert p99([i / 1000 for i in range(1, 101)]) == 0.099
    assert p99([i / 1000 for i in range(1, 1001)]) == 0.990


def test_summary_counts_only_outcomes_since_a_time() -> None:
    window = OutcomeWindow(max_items=100)
    window.watch()
    for t in range(10):
        window.record(float(t), failed=t % 5 == 0, latency_s=t / 100)
    everything = window.summary(0.0)
    assert (everything.requests, everything.errors) == (10, 2)
    recent = window.summary(6.0)
    assert (recent.requests, recent.errors, recent.p99_s) == (4, 0, 0.09)
    assert window.summary(100.0).requests == 0
    assert recent.to_dict()["error_rate"] == 0.0


def test_the_window_keeps_the_newest_items() -> None:
    window = OutcomeWindow(max_items=3)
    window.watch()
    for t in range(10):
        window.record(float(t), failed=False, latency_s=0.0)
    assert window.summary(0.0).requests == 3


def test_a_batch_of_successes_is_each_of_its_requests() -> None:
    window = OutcomeWindow(max_items=100)
    window.watch()
    window.record(1.0, failed=True, latency_s=0.5)
    window.successes(2.0, [0.01, 0.02, 0.03])
    summary = window.summary(0.0)
    assert (summary.requests, summary.errors, summary.p99_s) == (4, 1, 0.5)
    assert window.summary(1.5).requests == 3


def test_outcomes_are_kept_only_while_a_reader_watches() -> None:
    """No rollout reads them: nothing is kept (a batch pays one comparison). Kept from
    the first reader's start, until the last one ends; then they go."""
    window = OutcomeWindow(max_items=100)
    window.record(1.0, failed=True, latency_s=0.5)
    window.successes(1.0, [0.01, 0.02])
    assert window.summary(0.0).requests == 0
    window.watch()
    window.watch()
    window.successes(2.0, [0.01, 0.02])
    window.unwatch()
    window.record(3.0, failed=True, latency_s=0.5)
    assert (window.summary(0.0).requests, window.summary(0.0).errors) == (3, 1)
    window.unwatch()
    assert window.summary(0.0).requests == 0
