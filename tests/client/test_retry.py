"""Retry decisions: which answers are tried again, and how long the client waits."""

from __future__ import annotations

import random

import pytest

from fnrt.client.retry import DEFAULT_RETRY, NO_RETRY, Attempts, RetryPolicy, retry_after_s


def _attempts(policy: RetryPolicy = DEFAULT_RETRY, idempotent: bool = True) -> Attempts:
    return Attempts(policy, idempotent, random.Random(7))


@pytest.mark.parametrize("status", [200, 400, 404, 413, 422, 500, 504])
def test_answers_other_than_429_and_503_are_final(status: int) -> None:
    assert _attempts().after_status(status, None) is None


@pytest.mark.parametrize("status", [429, 503])
def test_429_and_503_wait_as_retry_after_says(status: int) -> None:
    assert _attempts().after_status(status, 1.5) == 1.5


def test_without_retry_after_the_backoff_grows_with_jitter_under_its_ceiling() -> None:
    policy = RetryPolicy(attempts=6, backoff_s=0.1, backoff_max_s=0.5)
    attempts = _attempts(policy)
    waits = [attempts.after_status(503, None) for _ in range(5)]
    ceilings = [0.1, 0.2, 0.4, 0.5, 0.5]
    assert all(w is not None and 0 <= w <= c for w, c in zip(waits, ceilings, strict=True))
    assert attempts.after_status(503, None) is None  # the sixth answer is the last


def test_a_call_that_is_not_idempotent_is_never_sent_twice() -> None:
    attempts = _attempts(idempotent=False)
    assert attempts.after_status(429, 1.0) is None
    assert _attempts(idempotent=False).after_no_connection() is None


def test_a_retry_after_longer_than_max_wait_ends_the_call() -> None:
    assert _attempts(RetryPolicy(max_wait_s=10)).after_status(429, 11) is None


def test_no_retry_tries_once() -> None:
    assert _attempts(NO_RETRY).after_status(429, 0.0) is None
    assert _attempts(NO_RETRY).after_no_connection() is None


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after_s("3") == 3.0
    assert retry_after_s(None) is None
    assert retry_after_s("soon") is None
    now = 1_700_000_000.0  # Tue, 14 Nov 2023 22:13:20 GMT
    assert retry_after_s("Tue, 14 Nov 2023 22:13:25 GMT", lambda: now) == 5.0
    assert retry_after_s("Tue, 14 Nov 2023 22:13:00 GMT", lambda: now) == 0.0


def test_a_policy_must_try_at_least_once() -> None:
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)
