from __future__ import annotations

from fnrt.functions.manifest import BreakerConfig
from fnrt.runtime.breaker import Breaker, BreakerState, Probing, next_state
from fnrt.runtime.outcomes import Summary

CONFIG = BreakerConfig(
    window_s=10, min_requests=10, open_error_rate=0.05, open_s=5, half_open_probes=4
)
CLOSED, OPEN, HALF = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN


def test_closed_opens_past_the_error_rate_with_enough_requests() -> None:
    assert next_state(CONFIG, CLOSED, Summary(10, 1, 0), 0, Probing(), 0) is OPEN
    assert next_state(CONFIG, CLOSED, Summary(20, 1, 0), 0, Probing(), 0) is CLOSED  # 5%
    assert next_state(CONFIG, CLOSED, Summary(5, 5, 0), 0, Probing(), 0) is CLOSED  # too few


def test_open_turns_half_open_after_open_s() -> None:
    assert next_state(CONFIG, OPEN, Summary(0, 0, 0), 100, Probing(), 104.9) is OPEN
    assert next_state(CONFIG, OPEN, Summary(0, 0, 0), 100, Probing(), 105) is HALF


def test_half_open_closes_on_clean_probes_and_reopens_on_a_failed_one() -> None:
    assert next_state(CONFIG, HALF, Summary(0, 0, 0), 0, Probing(4, 3, 0), 0) is HALF
    assert next_state(CONFIG, HALF, Summary(0, 0, 0), 0, Probing(4, 4, 0), 0) is CLOSED
    assert next_state(CONFIG, HALF, Summary(0, 0, 0), 0, Probing(2, 1, 1), 0) is OPEN


def test_disabled_never_opens() -> None:
    off = BreakerConfig(enabled=False)
    assert next_state(off, CLOSED, Summary(100, 100, 0), 0, Probing(), 0) is CLOSED


def test_a_breaker_walks_through_its_states() -> None:
    breaker = Breaker(CONFIG)
    for i in range(9):
        assert breaker.allow(float(i))
        breaker.record(float(i), failed=False)
    assert breaker.allow(9.0)
    breaker.record(9.0, failed=True)  # 1 of 10 failed: 10% > 5%
    assert breaker.state is OPEN and breaker.opened == 1
    assert not breaker.allow(10.0)  # fallback while open
    assert breaker.allow(14.0)  # half-open: the first probe
    assert breaker.state is HALF
    assert [breaker.allow(14.0) for _ in range(4)] == [True, True, True, False]  # 4 probes
    for _ in range(4):
        breaker.record(14.5, failed=False)
    assert breaker.state is CLOSED
    assert breaker.allow(15.0)


def test_a_failed_probe_opens_it_again() -> None:
    breaker = Breaker(CONFIG)
    for i in range(10):
        breaker.record(float(i), failed=True)
    assert breaker.state is OPEN
    assert breaker.allow(20.0)
    breaker.record(20.1, failed=True)
    assert breaker.state is OPEN and breaker.opened == 2
    assert not breaker.allow(21.0)


def test_old_failures_leave_the_window() -> None:
    breaker = Breaker(CONFIG)
    for i in range(5):
        breaker.record(float(i), failed=True)  # below min_requests: stays closed
    for i in range(20):
        breaker.record(100.0 + i / 10, failed=False)
    breaker.record(103.0, failed=True)  # 1 of 21 in the window: under 5%
    assert breaker.state is CLOSED


def test_deaths_in_a_row_open_it_however_few_requests_there_were() -> None:
    few = Summary(2, 2, 0)  # under min_requests
    assert next_state(CONFIG, CLOSED, few, 0, Probing(), 0, deaths=2) is CLOSED
    assert next_state(CONFIG, CLOSED, few, 0, Probing(), 0, deaths=3) is OPEN
    never = BreakerConfig(open_after_deaths=0)
    assert next_state(never, CLOSED, few, 0, Probing(), 0, deaths=50) is CLOSED


def test_it_stays_open_while_the_restart_backs_off() -> None:
    assert next_state(CONFIG, OPEN, Summary(0, 0, 0), 100, Probing(), 105, not_before=107) is OPEN
    assert next_state(CONFIG, OPEN, Summary(0, 0, 0), 100, Probing(), 107, not_before=107) is HALF


def test_a_crash_loop_opens_it_and_a_death_while_probing_opens_it_again() -> None:
    breaker = Breaker(CONFIG)
    breaker.record(0.0, failed=True)
    assert not breaker.lost(0.0, retry_at=0.5)
    assert not breaker.lost(1.0, retry_at=2.0)
    assert breaker.lost(3.0, retry_at=7.0)  # the third in a row
    assert breaker.state is OPEN and breaker.describe(3.0)["deaths_in_a_row"] == 3
    assert breaker.retry_after_s(3.0) == 5.0  # open_s
    assert not breaker.allow(7.5)
    breaker.not_before = 12.0
    assert breaker.retry_after_s(8.0) == 4.0  # the backoff, longer than open_s
    assert not breaker.allow(11.9)
    assert breaker.allow(12.0) and breaker.state is HALF  # a probe
    assert breaker.lost(12.5, retry_at=20.0)  # it killed its instance
    assert breaker.state is OPEN and breaker.opened == 2
    assert breaker.retry_after_s(13.0) == 7.0


def test_a_success_between_deaths_starts_the_count_again() -> None:
    breaker = Breaker(CONFIG)
    breaker.lost(0.0, retry_at=0.5)
    breaker.lost(1.0, retry_at=2.0)
    breaker.record(2.5, failed=False)
    assert not breaker.lost(3.0, retry_at=3.5)
    assert breaker.state is CLOSED and breaker.deaths == 1


def test_a_batch_of_successes_counts_as_many_requests_and_leaves_the_window_together() -> None:
    breaker = Breaker(CONFIG)
    breaker.record(0.0, failed=False, count=19)  # one batch
    breaker.record(1.0, failed=True)  # 1 of 20: 5%, not over
    assert breaker.state is CLOSED
    assert (breaker.window.requests, breaker.window.errors) == (20, 1)
    breaker.record(10.5, failed=True)  # the batch has left the window: 2 of 2, too few
    assert (breaker.window.requests, breaker.window.errors) == (2, 2)
    assert breaker.state is CLOSED


def test_a_batch_while_half_open_counts_its_probes_one_at_a_time() -> None:
    """Probes that close the breaker part way through a batch: the rest are counted in the
    window judged afresh, as when they are recorded one by one."""
    one, batched = Breaker(CONFIG), Breaker(CONFIG)
    for breaker in (one, batched):
        for i in range(10):
            breaker.record(float(i), failed=True)
        assert breaker.allow(14.0) and breaker.state is HALF
        for _ in range(3):
            breaker.allow(14.0)
    for _ in range(6):
        one.record(14.5, failed=False)
    batched.record(14.5, failed=False, count=6)
    assert one.state is batched.state is CLOSED
    assert (one.window.requests, one.window.errors) == (2, 0)  # the two after it closed
    assert (batched.window.requests, batched.window.errors) == (2, 0)
