from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fnrt.runtime.prewarm.trace import (
    MINUTES,
    Shape,
    TraceError,
    read_app_memory,
    read_invocations,
    synthetic,
    write_invocations,
)

HEADER = "HashOwner,HashApp,HashFunction,Trigger," + ",".join(str(m) for m in range(1, 1441))


def test_synthetic_traces_round_trip_through_the_published_layout(tmp_path: Path) -> None:
    trace = synthetic(60, days=2, seed=3)
    assert trace.counts.shape == (60, 2 * MINUTES) and trace.counts.sum() > 0
    assert set(trace.triggers) <= {"timer", "http"}
    paths = write_invocations(trace, tmp_path)
    assert [p.name for p in paths] == [
        "invocations_per_function_md.anon.d01.csv",
        "invocations_per_function_md.anon.d02.csv",
    ]
    assert paths[0].read_text().splitlines()[0] == HEADER
    again = read_invocations(paths)
    assert again.functions == trace.functions
    np.testing.assert_array_equal(again.counts, trace.counts)


def test_the_same_seed_makes_the_same_trace() -> None:
    np.testing.assert_array_equal(synthetic(20, seed=5).counts, synthetic(20, seed=5).counts)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("o,a,f,http," + ",".join(["0"] * 1439), r"t\.csv:2: 1443 fields, expected 1444"),
        ("o,a,f,http," + ",".join(["0"] * 1439 + ["x"]), r"t\.csv:2: 'x' is not a count"),
        ("o,a,f,http," + ",".join(["-1"] * 1440), r"t\.csv:2: negative count"),
    ],
)
def test_malformed_files_name_the_line_at_fault(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "\n" + line + "\n")
    with pytest.raises(TraceError, match=message):
        read_invocations([path])


def test_bad_header_and_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("a,b,c\n")
    with pytest.raises(TraceError, match=r"t\.csv:1: header"):
        read_invocations([path])
    row = "o,a,f,http," + ",".join(["1"] * 1440)
    path.write_text(f"{HEADER}\n{row}\n{row}\n")
    with pytest.raises(TraceError, match=r"t\.csv:3: function f appears twice"):
        read_invocations([path])
    with pytest.raises(TraceError, match="no trace file"):
        read_invocations([])


def test_app_memory(tmp_path: Path) -> None:
    trace = synthetic(3, seed=1)
    memory = tmp_path / "m.csv"
    memory.write_text(
        "HashOwner,HashApp,SampleCount,AverageAllocatedMb\n"
        f"o,{trace.apps[0]},5,256\no,{trace.apps[2]},5,128\n"
    )
    read_app_memory(memory, trace)
    assert trace.memory_mb is not None
    assert trace.memory_mb[0] == 256 and np.isnan(trace.memory_mb[1])


def test_synthetic_days_vary_in_size_rate_and_burstiness() -> None:
    base = synthetic(200, seed=4)
    busy = synthetic(200, seed=4, shape=Shape(rate=4.0))
    assert busy.counts.sum() > 2 * base.counts.sum()
    lumpy = synthetic(200, seed=4, shape=Shape(burstiness=4.0))
    http = [i for i, t in enumerate(base.triggers) if t == "http"]
    # the same calls or so, in fewer runs of busy minutes
    runs = [
        int((np.diff((t.counts[http] > 0).astype(int), axis=1) == 1).sum()) for t in (base, lumpy)
    ]
    assert runs[1] < runs[0] / 2
    large = synthetic(200, seed=4, shape=Shape(memory_median_mb=2000))
    assert large.memory_mb is not None and base.memory_mb is not None
    assert np.median(large.memory_mb) > 10 * np.median(base.memory_mb)
    with pytest.raises(ValueError, match="rate"):
        Shape(rate=0)
