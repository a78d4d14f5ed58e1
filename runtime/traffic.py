"""Traffic decisions: which version answers a request, and how a canary is judged.

Pure functions: the registry and the rollout task call them with what they
observed, so every rule is tested directly.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from fnrt.functions.manifest import RolloutConfig
from fnrt.runtime.outcomes import Summary

#: Requests fall into this many buckets; a version's share is a run of them.
BUCKETS = 10_000


def bucket_of(sticky_key: str | None, rng: random.Random | None = None) -> int:
    """A request's bucket: a hash of its sticky key (same key, same bucket), else random."""
    if sticky_key is None:
        return (rng or random).randrange(BUCKETS)
    digest = hashlib.blake2b(sticky_key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % BUCKETS


def choose_version(traffic: Mapping[str, int], bucket: int) -> str:
    """The version whose run of buckets holds ``bucket`` (shares are percentages).

    Versions take their runs in a fixed order (sorted ids), so a sticky key
    keeps its version while the shares stay the same, and while the share of
    the version it is on grows.
    """
    edge = 0
    chosen = ""
    for version in sorted(traffic):
        share = traffic[version]
        if share <= 0:
            continue
        chosen = version
        edge += share * BUCKETS // 100
        if bucket < edge:
            return version
    return chosen  # rounding: the last version with a share takes the rest


class Verdict(Enum):
    HOLD = "hold"  # keep the current step
    ADVANCE = "advance"  # move to the next step (or finish)
    ROLL_BACK = "roll_back"


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    reason: str = ""


def judge_canary(
    config: RolloutConfig,
    baseline: Summary,
    canary: Summary,
    step_started_s: float,
    now: float,
    breaker_opened: int = 0,
) -> Judgement:
    """Roll back, advance or hold, from both versions' outcomes since the step began.

    The canary is judged once it has served ``min_requests``: its error rate
    may not exceed the baseline's by more than ``max_error_rate``, and its p99
    may not pass ``max_p99_ratio`` times the baseline's plus ``p99_slack_ms``
    (compared only when the baseline served ``min_requests`` too). A canary whose
    circuit breaker opened (``breaker_opened`` times since it began: its instances
    kept dying, or its errors passed the breaker's rate) is rolled back however few
    requests it served: those the breaker refuses never reach its outcomes. A step
    ends after ``dwell_s`` with no such failure.
    """
    if canary.requests >= config.min_requests:
        excess = canary.error_rate - baseline.error_rate
        if excess > config.max_error_rate:
            return Judgement(
                Verdict.ROLL_BACK,
                f"error rate {canary.error_rate:.1%} over {canary.requests} requests, "
                f"baseline {baseline.error_rate:.1%} (allowed +{config.max_error_rate:.1%})",
            )
        if baseline.requests >= config.min_requests:
            limit_s = baseline.p99_s * config.max_p99_ratio + config.p99_slack_ms / 1000
            if canary.p99_s > limit_s:
                return Judgement(
                    Verdict.ROLL_BACK,
                    f"p99 {canary.p99_s * 1000:.1f} ms, baseline "
                    f"{baseline.p99_s * 1000:.1f} ms (allowed up to {limit_s * 1000:.1f} ms)",
                )
    if breaker_opened:
        return Judgement(
            Verdict.ROLL_BACK, "its circuit breaker opened: its requests were being refused"
        )
    if now - step_started_s >= config.dwell_s:
        return Judgement(Verdict.ADVANCE)
    return Judgement(Verdict.HOLD)


def canary_traffic(baseline: str, canary: str, percent: int) -> dict[str, int]:
    """The split for one canary step."""
    if percent >= 100:
        return {canary: 100}
    return {baseline: 100 - percent, canary: percent}
