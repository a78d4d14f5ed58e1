"""A live node under a small memory budget evicts what ``fnrt simulate`` evicts, in order."""

from __future__ import annotations

from pathlib import Path

from replaysupport import replay, trace_slice


def test_a_live_node_evicts_what_the_simulator_evicts_in_the_same_order(
    tmp_path: Path,
) -> None:
    replayed = replay(tmp_path, trace_slice())
    assert replayed.budget_bytes is not None and replayed.live, "the budget never had to choose"
    assert all(replayed.sizes)
    assert replayed.live == replayed.simulated
