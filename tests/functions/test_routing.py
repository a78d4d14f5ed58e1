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
