"""The split planner as a pure function, on constructed profiles."""

from __future__ import annotations

import math

import pytest

from fnrt.edge.planner import Link, Profile, choose_split, predict

# Three segments (two split points): splits 0 (all server) .. 3 (all device).
PROFILE = Profile(
    device_ms=(2.0, 40.0, 10.0),  # the middle segment is heavy on the device
    server_ms=(0.2, 2.0, 0.5),
    sent_bytes=(100_000, 1_000, 400_000),  # input, a bottleneck, a wide activation
    result_bytes=40,
)


def test_the_prediction_adds_device_network_and_server_time() -> None:
    link = Link(bandwidth_bytes_per_s=1_000_000, rtt_ms=10)
    predicted = predict(PROFILE, link)
    assert predicted[0] == pytest.approx(0 + 10 + 100.04 + 2.7)
    assert predicted[1] == pytest.approx(2 + 10 + 1.04 + 2.5)
    assert predicted[2] == pytest.approx(42 + 10 + 400.04 + 0.5)
    assert predicted[3] == pytest.approx(52)  # nothing crosses the network


@pytest.mark.parametrize(
    ("bandwidth", "rtt_ms", "best"),
    [
        (1e9, 1, 0),  # a fast link: the server does it all
        (1e6, 10, 1),  # a middling one: cut at the bottleneck
        (1e4, 10, 3),  # a slow one: everything on the device
        (1e6, 100, 3),  # a far server: not worth the round trip
    ],
)
def test_the_planner_picks_the_known_best_split(bandwidth: float, rtt_ms: float, best: int) -> None:
    link = Link(bandwidth, rtt_ms)
    plan = choose_split(PROFILE, link)
    assert plan.split == best
    brute = min(range(4), key=lambda k: predict(PROFILE, link)[k])
    assert plan.split == brute and plan.latency_ms == min(plan.predicted_ms)


def test_server_load_moves_work_to_the_device() -> None:
    link = Link(1e9, 1)
    assert choose_split(PROFILE, link).split == 0
    busy = Profile(**{**PROFILE.__dict__, "server_wait_ms": 100.0})
    assert choose_split(busy, link).split == 3


def test_splits_not_allowed_are_never_chosen() -> None:
    link = Link(1e4, 10)
    plan = choose_split(PROFILE, link, allowed={0, 1, 2})  # the whole model does not fit
    assert plan.split == 1 and math.isinf(plan.predicted_ms[3])
    with pytest.raises(ValueError, match="no split"):
        choose_split(PROFILE, link, allowed=set())


def test_a_tie_goes_to_the_split_sending_less() -> None:
    flat = Profile(device_ms=(0, 0), server_ms=(0, 0), sent_bytes=(10, 10))
    assert choose_split(flat, Link(1e12, 0)).split == 2  # sends nothing at all


def test_an_unknown_device_segment_rules_out_the_splits_past_it() -> None:
    partial = Profile(**{**PROFILE.__dict__, "device_ms": (2.0, math.inf, math.inf)})
    plan = choose_split(partial, Link(1e4, 10))
    assert plan.split == 1


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"device_ms": (1.0,)}, "device_ms"),
        ({"sent_bytes": (1, 2)}, "sent_bytes"),
        ({"server_ms": ()}, "server_ms"),
        ({"server_ms": (1.0, -1.0, 0.0)}, "server_ms"),
        ({"server_wait_ms": -1.0}, "server_wait_ms"),
    ],
)
def test_profiles_are_validated(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Profile(**{**PROFILE.__dict__, **changes})


def test_links_are_validated() -> None:
    with pytest.raises(ValueError, match="bandwidth"):
        Link(0, 1)
    with pytest.raises(ValueError, match="rtt"):
        Link(1, -1)
