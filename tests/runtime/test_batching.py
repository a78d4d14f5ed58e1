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


# --- adaptive ---------------------------------------------------------------------

from fnrt.runtime.batching import (  # noqa: E402
    CostModel,
    RateEstimator,
    adaptive_plan,
    largest_batch_within,
    predicted_finish_s,
)

ADAPTIVE = BatchingConfig(max_batch_size=64, mode="adaptive", target_p99_ms=100)


def trained(per_item_s: float, fixed_s: float) -> CostModel:
    cost = CostModel()
    for n in (1, 4, 8, 16, 32, 2, 24):
        cost.observe(n, per_item_s * n + fixed_s)
    return cost


def test_cost_model_learns_per_item_and_fixed_cost() -> None:
    per_item, fixed = trained(0.002, 0.010).coefficients()
    assert abs(per_item - 0.002) < 1e-9 and abs(fixed - 0.010) < 1e-9
    same_size = CostModel()
    for _ in range(5):
        same_size.observe(4, 0.02)
    per_item, fixed = same_size.coefficients()
    assert abs(per_item - 0.005) < 1e-12 and fixed == 0.0


def test_cost_model_follows_drift() -> None:
    cost = trained(0.002, 0.0)
    for _ in range(300):
        for n in (4, 8):
            cost.observe(n, 0.004 * n)
    assert abs(cost.coefficients()[0] - 0.004) < 1e-4


def test_batch_size_keeps_compute_within_half_the_target() -> None:
    cost = trained(0.002, 0.010)  # 50 ms budget -> (50 - 10) / 2 = 20 items
    assert largest_batch_within(ADAPTIVE, cost, 0.050) == 20
    plan = adaptive_plan(ADAPTIVE, cost, rate_per_s=1000, queued=25, oldest_wait_s=0)
    assert (plan.size, plan.wait_s) == (20, 0.0)  # a long queue leaves at once


def test_waits_to_fill_when_arrivals_are_dense() -> None:
    cost = trained(0.002, 0.010)
    plan = adaptive_plan(ADAPTIVE, cost, rate_per_s=1000, queued=10, oldest_wait_s=0.001)
    assert plan.size == 20 and abs(plan.wait_s - 0.010) < 1e-9  # 10 more at 1000/s


def test_does_not_wait_when_arrivals_are_sparse_or_time_is_up() -> None:
    cost = trained(0.002, 0.010)
    assert adaptive_plan(ADAPTIVE, cost, rate_per_s=5, queued=1, oldest_wait_s=0).wait_s == 0.0
    assert (
        adaptive_plan(ADAPTIVE, cost, rate_per_s=1000, queued=10, oldest_wait_s=0.06).wait_s == 0.0
    )
    assert adaptive_plan(ADAPTIVE, cost, rate_per_s=0, queued=1, oldest_wait_s=0).wait_s == 0.0


def test_untrained_adaptive_behaves_like_fixed() -> None:
    plan = adaptive_plan(ADAPTIVE, CostModel(), rate_per_s=1000, queued=3, oldest_wait_s=0)
    assert (plan.size, plan.wait_s) == (64, 0.0)


def test_predicted_finish_counts_batches_ahead_per_instance() -> None:
    cost = trained(0.002, 0.010)  # batches of 20 take 50 ms
    assert abs(predicted_finish_s(ADAPTIVE, cost, queued_ahead=0, instances=1) - 0.050) < 1e-9
    assert abs(predicted_finish_s(ADAPTIVE, cost, queued_ahead=45, instances=1) - 0.150) < 1e-9
    assert abs(predicted_finish_s(ADAPTIVE, cost, queued_ahead=45, instances=3) - 0.050) < 1e-9


def test_rate_estimator() -> None:
    rate = RateEstimator(weight=0.5)
    assert rate.rate_per_s(0) == 0
    for t in range(1, 11):
        rate.arrive(t * 0.01)
    assert abs(rate.rate_per_s(0.1) - 100) < 1
    assert rate.rate_per_s(1.1) < 1.01  # a second without arrivals lowers it


def test_a_batch_is_sent_ahead_only_when_no_deadline_in_it_can_pass_first() -> None:
    from fnrt.runtime.batching import may_send_ahead

    assert may_send_ahead(None, now=10.0, running_left_s=None)  # no deadline: always
    assert may_send_ahead(None, now=10.0, running_left_s=5.0)
    assert not may_send_ahead(11.0, now=10.0, running_left_s=None)  # nothing predicted yet
    assert not may_send_ahead(10.25, now=10.0, running_left_s=1.0)  # passes while k runs
    assert not may_send_ahead(11.0, now=10.0, running_left_s=1.0)  # passes as k ends
    assert may_send_ahead(11.5, now=10.0, running_left_s=1.0)
