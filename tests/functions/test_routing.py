from __future__ import annotations

import pytest

from fnrt.functions.errors import FnrtError
from fnrt.functions.routing import HISTORY_LIMIT, Routing


def test_cut_over_keeps_history_newest_first() -> None:
    r = Routing.first("v-1", "t0").cut_over("v-2", "t1").cut_over("v-3", "t2")
    assert r.traffic == {"v-3": 100}
    assert r.previous == ("v-2", "v-1")
    assert r.primary == "v-3"
    assert Routing.from_json(r.to_json()) == r
    # re-deploying an old version moves it out of history
    assert r.cut_over("v-1", "t3").previous == ("v-3", "v-2")


def test_history_is_bounded() -> None:
    r = Routing.first("v-0", "t")
    for i in range(1, 40):
        r = r.cut_over(f"v-{i}", "t")
    assert len(r.previous) == HISTORY_LIMIT


def test_invalid_routing_is_refused() -> None:
    with pytest.raises(ValueError, match="sum to 100"):
        Routing(traffic={"a": 50})
    with pytest.raises(FnrtError, match="malformed"):
        Routing.from_json(b'{"traffic": 3}')


def test_a_split_keeps_the_old_primary_first_in_history() -> None:
    r = Routing.first("v-a", "t0").cut_over("v-b", "t1")
    split = r.with_traffic({"v-a": 10, "v-b": 90}, "t2")
    assert split.primary == "v-b" and split.previous == ("v-a",)
    flipped = split.with_traffic({"v-a": 60, "v-b": 40}, "t3")
    assert flipped.primary == "v-a" and flipped.previous[0] == "v-b"
    assert flipped.rolled_back("t4").traffic == {"v-b": 100}
    dropped = split.with_traffic({"v-c": 100, "v-b": 0}, "t5")
    assert dropped.traffic == {"v-c": 100} and dropped.previous == ("v-b", "v-a")


def test_rollback_needs_history() -> None:
    with pytest.raises(FnrtError, match="no earlier version"):
        Routing.first("v-a", "t0").rolled_back("t1")
    r = Routing.first("v-a", "t0").cut_over("v-b", "t1").rolled_back("t2")
    assert r.traffic == {"v-a": 100} and r.previous == ("v-b",)


def test_a_rollback_during_a_split_returns_to_where_the_split_began() -> None:
    """A canary's split, rolled back from any node (which knows nothing of the canary):
    all traffic back to the version it began from, the canary's version in no history."""
    r = Routing.first("v-0", "t0").cut_over("v-1", "t1")
    for share in (10, 50, 90):
        split = r.with_traffic({"v-1": 100 - share, "v-2": share}, "t2")
        assert split.source == "v-1" and Routing.from_json(split.to_json()) == split
        later = split.with_traffic({"v-1": 40, "v-2": 60}, "t3")  # the next step
        for routing in (split, later):
            back = routing.rolled_back("t4")
            assert back.traffic == {"v-1": 100} and back.previous == ("v-0",)
            assert back.source == ""
    done = r.with_traffic({"v-2": 100}, "t5")  # the canary's last step: no split now
    assert done.source == "" and done.rolled_back("t6").traffic == {"v-1": 100}
