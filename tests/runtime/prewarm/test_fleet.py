"""The fleet simulator: routing against cold starts, store fetches, memory and balance."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fnrt.runtime.cli.main import main
from fnrt.runtime.prewarm.fleet import FleetConfig, Routing, rendezvous, simulate_fleet, water_fill
from fnrt.runtime.prewarm.policies import Policy
from fnrt.runtime.prewarm.trace import Trace, read_app_memory, read_invocations, synthetic

SAMPLE = Path(__file__).resolve().parents[3] / "examples" / "traces" / "azure2019-sample"
ROOMY = {"memory_budget_mb": 1e12, "disk_budget_mb": 1e12}


def test_one_roomy_node_is_the_single_node_simulator() -> None:
    trace = read_invocations([SAMPLE / "invocations_per_function.csv"])
    read_app_memory(SAMPLE / "app_memory.csv", trace)
    outcome = simulate_fleet(trace, FleetConfig(1, policy=Policy.FIXED, **ROOMY))
    # the sample's published reference for a fixed 10 minutes (test_simulator.py)
    assert (outcome.cold_starts, outcome.invocations) == (3180, 2_903_712)
    assert outcome.l3_fetches == outcome.cold_l3 == 330  # each function fetched once
    assert outcome.imbalance == 1.0


def test_hash_fetches_each_function_once_round_robin_on_every_node() -> None:
    trace = synthetic(60, seed=3)
    called = int(trace.counts.any(axis=1).sum())
    runs = {r: simulate_fleet(trace, FleetConfig(4, r, **ROOMY)) for r in Routing}
    hashed, spread = runs[Routing.HASH], runs[Routing.ROUND_ROBIN]
    assert hashed.l3_fetches == called  # one node per function
    assert spread.l3_fetches > 2 * called  # most functions land on most nodes
    assert spread.cold_starts > hashed.cold_starts
    assert spread.memory_gb_hours > hashed.memory_gb_hours
    assert spread.imbalance < 1.05 and runs[Routing.LEAST_LOADED].imbalance < 1.05
    assert hashed.imbalance > spread.imbalance
    assert {o.invocations for o in runs.values()} == {int(trace.counts.sum())}


def test_a_small_memory_budget_evicts_and_costs_cold_starts() -> None:
    trace = synthetic(60, seed=4)
    roomy = simulate_fleet(trace, FleetConfig(2, **ROOMY))
    tight = simulate_fleet(
        trace, FleetConfig(2, memory_budget_mb=4 * 256, disk_budget_mb=1e12)
    )  # room for 4 instances of the default 256 MB
    assert tight.evictions > 0 and roomy.evictions == 0
    assert tight.cold_starts > roomy.cold_starts
    assert tight.cold_l3 == roomy.cold_l3  # files stay on disk: the extra cold starts are L2
    small_disk = simulate_fleet(trace, FleetConfig(2, memory_budget_mb=4 * 256, disk_budget_mb=512))
    assert small_disk.l3_fetches > tight.l3_fetches


def test_a_node_short_of_memory_evicts_by_worth_as_a_node_does() -> None:
    """A periodic function, called every 3 minutes, and one called once are idle when a
    third loads into room for two: the one called once goes (a node's budget weighs each
    by its plan), where least recently used would evict the periodic one just before
    its next call, as it does under the other policies (all alike there, as on a node:
    the least recently called first)."""
    counts = np.zeros((3, 60), dtype=np.int32)
    counts[0, 1::3] = 1  # tick: minutes 1, 4, ... 19, 22 ...
    counts[1, 20] = 1  # once
    counts[2, 21] = 1  # new: room for two
    trace = Trace(["tick", "once", "new"], ["a", "b", "c"], ["timer"] * 3, counts)
    config = {"memory_budget_mb": 2 * 256, "disk_budget_mb": 1e12}  # 256 MB each
    by_worth = simulate_fleet(trace, FleetConfig(1, **config))
    assert (by_worth.cold_starts, by_worth.evictions) == (3, 1)  # each one's first call
    for policy in (Policy.FIXED, Policy.HISTOGRAM):  # as a node weighs them: all alike
        by_recency = simulate_fleet(trace, FleetConfig(1, policy=policy, **config))
        assert (by_recency.cold_starts, by_recency.evictions) == (4, 2), policy  # tick's too


def test_water_fill_fills_the_least_loaded_first() -> None:
    shares = water_fill(np.array([5, 0, 0, 10]), 7)
    assert shares.sum() == 7 and shares[0] == shares[3] == 0
    assert sorted(shares[1:3].tolist()) == [3, 4]
    assert water_fill(np.array([1, 1]), 5).tolist() in ([3, 2], [2, 3])


def test_a_new_node_takes_functions_only_for_itself() -> None:
    names = [f"fn-{i}" for i in range(400)]
    before = [rendezvous(n, 4) for n in names]
    after = [rendezvous(n, 5) for n in names]
    moved = [a for b, a in zip(before, after, strict=True) if a != b]
    assert moved and set(moved) == {4}  # nothing moves between the old nodes
    assert 40 < len(moved) < 120  # about a fifth


@pytest.mark.parametrize("routing", ["hash", "least_loaded"])
def test_the_cli_prints_a_row_per_fleet_and_plots(
    tmp_path: Path, routing: str, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = ["--nodes", "2,3"] if routing == "hash" else ["--nodes", "2", "--nodes", "3"]
    argv = ["simulate", "--synthetic", "30", *nodes, "--routing", routing]
    assert main([*argv, "--plot", str(tmp_path / "fleet.png")]) == 0
    out = capsys.readouterr().out
    assert out.count(f"\n{routing}") == 2 and "L3 fetches" in out
    assert (tmp_path / "fleet.png").stat().st_size > 10_000
