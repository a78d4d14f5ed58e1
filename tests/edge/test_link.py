"""The moving estimate of RTT and bandwidth from timed requests."""

from __future__ import annotations

import random

import pytest

from fnrt.edge.link import LinkConfig, LinkEstimate
from fnrt.edge.planner import Link


def timed(link: Link, size: int, server_s: float = 0.0, noise_ms: float = 0.0) -> float:
    """Seconds a request of ``size`` bytes takes over ``link`` (plus the server's part)."""
    ms = link.rtt_ms + link.transfer_ms(size) + random.uniform(0, noise_ms)
    return ms / 1000.0 + server_s


@pytest.mark.parametrize("bandwidth", [5e4, 1e6, 2e7])
def test_it_finds_rtt_and_bandwidth_from_two_sizes(bandwidth: float) -> None:
    link = Link(bandwidth, 8.0)
    estimate = LinkEstimate()
    assert estimate.link is None
    estimate.observe(3_000, timed(link, 3_000, server_s=0.2), server_s=0.2)
    assert estimate.link is None  # one size says nothing about the slope
    estimate.observe(65_536, timed(link, 65_536))
    found = estimate.link
    assert found is not None
    assert found.bandwidth_bytes_per_s == pytest.approx(bandwidth, rel=1e-6)
    assert found.rtt_ms == pytest.approx(8.0, abs=1e-6)


def test_it_follows_a_link_that_changes_and_says_a_plan_is_stale() -> None:
    random.seed(1)
    estimate = LinkEstimate(LinkConfig(weight=0.3))
    before, after = Link(1e6, 10), Link(1e5, 10)
    for i in range(30):
        size = (2_000, 40_000)[i % 2]
        estimate.observe(size, timed(before, size, noise_ms=0.5))
    planned = estimate.link
    assert planned is not None
    assert planned.bandwidth_bytes_per_s == pytest.approx(1e6, rel=0.1)
    assert not estimate.changed_since(planned)
    for i in range(30):
        size = (2_000, 40_000)[i % 2]
        estimate.observe(size, timed(after, size, noise_ms=0.5))
    now = estimate.link
    assert now is not None and now.bandwidth_bytes_per_s == pytest.approx(1e5, rel=0.1)
    assert estimate.changed_since(planned)


def test_a_link_too_fast_to_time_reads_as_very_fast() -> None:
    estimate = LinkEstimate()
    estimate.observe(1_000, 0.002)
    estimate.observe(100_000, 0.001)  # the larger request happened to be quicker
    found = estimate.link
    assert found is not None and found.bandwidth_bytes_per_s >= 1e9


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="weight"):
        LinkConfig(weight=0)
    with pytest.raises(ValueError, match="probe_bytes"):
        LinkConfig(probe_bytes=10)


def test_a_restart_keeps_only_the_newest_sample() -> None:
    old, new = Link(1e7, 2), Link(5e4, 20)
    estimate = LinkEstimate()
    for size in (2_000, 60_000, 2_000, 60_000):
        estimate.observe(size, timed(old, size))
    estimate.observe(12_000, timed(new, 12_000))
    estimate.restart()
    assert estimate.link is None and estimate.last_bytes == 12_000
    estimate.observe(65_536, timed(new, 65_536))
    found = estimate.link
    assert found is not None
    assert found.bandwidth_bytes_per_s == pytest.approx(5e4, rel=1e-6)
    assert found.rtt_ms == pytest.approx(20, abs=1e-6)


def test_noise_on_a_fast_link_is_not_a_change() -> None:
    estimate = LinkEstimate()
    planned = Link(1e8, 5.0)  # 64 KiB take 5.66 ms
    assert not estimate.changed_since(None)
    estimate.observe(2_000, timed(Link(3e8, 5.5), 2_000))
    estimate.observe(65_536, timed(Link(3e8, 5.5), 65_536))  # 3x the bandwidth: 0.4 ms less
    assert not estimate.changed_since(planned)
    estimate.restart()
    estimate.observe(65_536, timed(Link(5e6, 5.0), 65_536))
    estimate.observe(2_000, timed(Link(5e6, 5.0), 2_000))
    assert estimate.changed_since(planned)  # 64 KiB now take 18 ms
