from __future__ import annotations

from pathlib import Path

import numpy as np

from fnrt.runtime.prewarm.policies import Policy
from fnrt.runtime.prewarm.simulator import simulate, simulate_one
from fnrt.runtime.prewarm.trace import Trace, read_app_memory, read_invocations, synthetic

SAMPLE = Path(__file__).resolve().parents[3] / "examples" / "traces" / "azure2019-sample"


def one(row: list[int]) -> Trace:
    counts = np.zeros((1, 1440), dtype=np.int32)
    counts[0, : len(row)] = row
    return Trace(["f"], ["a"], ["http"], counts)


def test_a_fixed_keep_alive_by_hand() -> None:
    # calls at minutes 0, 5 and 30: the second within 10 minutes, the third not
    row = [0] * 31
    row[0], row[5], row[30] = 2, 1, 1
    from fnrt.runtime.prewarm.policies import PolicyConfig

    outcome = simulate_one(one(row), Policy.FIXED, PolicyConfig(keep_alive_min=10))
    assert (outcome.invocations, outcome.cold_starts) == (4, 2)
    assert outcome.idle_minutes == 4 + 10 + 10  # 4 before the 2nd call, 10, then 10 at the end
    assert outcome.function_percentile(75) == 50.0


def test_the_azure_sample_matches_its_published_reference() -> None:
    trace = read_invocations([SAMPLE / "invocations_per_function.csv"])
    read_app_memory(SAMPLE / "app_memory.csv", trace)
    (fixed,) = simulate(trace, [Policy.FIXED], fixed_keep_alive_min=(10,))
    # the sample's README: 3,180 cold starts in 2,903,712 invocations, 75th-percentile
    # function 42.9% cold, 87,018 function-minutes (115,572 GB-min) warm while idle
    assert (fixed.cold_starts, fixed.invocations) == (3180, 2_903_712)
    assert round(fixed.function_percentile(75), 1) == 42.9
    assert round(fixed.idle_minutes) == 87_018
    assert fixed.idle_gb_minutes is not None and round(fixed.idle_gb_minutes) == 115_572


def test_auto_beats_a_fixed_ten_minutes_on_synthetic_traces() -> None:
    trace = synthetic(300, days=2, seed=11)
    fixed, auto = simulate(trace, [Policy.FIXED, Policy.AUTO], fixed_keep_alive_min=(10,))
    assert auto.cold_percent < fixed.cold_percent
    assert auto.idle_minutes < fixed.idle_minutes
    assert auto.idle_gb_minutes is not None and fixed.idle_gb_minutes is not None
    assert auto.idle_gb_minutes < fixed.idle_gb_minutes
    assert auto.prewarms > 0 and auto.prewarms_unused < auto.prewarms


def test_workers_give_the_same_answer() -> None:
    trace = synthetic(40, seed=2)
    alone = simulate(trace, [Policy.FIXED, Policy.HISTOGRAM], fixed_keep_alive_min=(5, 10))
    pooled = simulate(
        trace, [Policy.FIXED, Policy.HISTOGRAM], fixed_keep_alive_min=(5, 10), workers=2
    )
    assert [o.row() for o in alone] == [o.row() for o in pooled]
    assert [o.label for o in alone] == ["fixed 5 min", "fixed 10 min", "histogram"]


def test_the_table_and_the_plot_count_idle_memory_in_the_same_unit(tmp_path: Path) -> None:
    from fnrt.runtime.prewarm.report import plot, table

    trace = read_invocations([SAMPLE / "invocations_per_function.csv"])
    read_app_memory(SAMPLE / "app_memory.csv", trace)
    (fixed,) = simulate(trace, [Policy.FIXED], fixed_keep_alive_min=(10,))
    head, row = table([fixed]).splitlines()
    assert "idle inst-h" in head and "idle GB-h" in head  # the plot's axis: GB-hours
    assert "GB-min" not in head and "1,926" in row.split()  # 115,572 GB-minutes / 60
    # two policies at the same point are both drawn (hollow markers, smaller on top)
    same = simulate(trace, [Policy.HISTOGRAM, Policy.HISTOGRAM], fixed_keep_alive_min=())
    assert same[0].row() == same[1].row()
    assert plot([fixed, *same], tmp_path / "p.png").stat().st_size > 10_000
