"""Triton's shapes of metadata, config and statistics, built from known values."""

from __future__ import annotations

from pathlib import Path

from fnrt.runtime.http.oip.triton import model_config, model_metadata, model_statistics
from fnrt.runtime.stats import Stats
from support import packed, write_function


def test_metadata_and_config_follow_the_manifest(tmp_path: Path) -> None:
    vm, _ = packed(write_function(tmp_path, "echo", max_batch_size=16))
    meta = model_metadata(vm, [vm.version, "v-older"])
    assert meta == {
        "name": "echo",
        "versions": [vm.version, "v-older"],
        "platform": "fnrt",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}],
    }
    config = model_config(vm, "cuda")
    assert config["max_batch_size"] == 0  # shapes already hold the rows dimension
    assert config["dynamic_batching"]["preferred_batch_size"] == [16]
    assert config["instance_group"] == [{"count": 1, "kind": "KIND_GPU"}]
    assert config["output"] == [{"name": "y", "data_type": "TYPE_FP32", "dims": [-1, 4]}]


def test_statistics_in_nanoseconds_with_batch_stats() -> None:
    stats = Stats()
    totals = stats.totals
    totals.success.add(0.003)
    totals.success.add(0.001)
    totals.fail.add(0.5)
    totals.queue.add(0.002, 2)
    totals.batch(2, 0.0001, 0.004, 0.0002)
    totals.last_request_unix_s = 1700000000.25
    stats.batches = 1
    out = model_statistics("echo", "v-1", stats)
    assert out["last_inference"] == 1700000000250
    assert out["inference_count"] == 2
    assert out["execution_count"] == 1
    inference = out["inference_stats"]
    assert inference["success"] == {"count": 2, "ns": 4_000_000}
    assert inference["fail"] == {"count": 1, "ns": 500_000_000}
    assert inference["compute_infer"] == {"count": 2, "ns": 8_000_000}  # per request
    assert out["batch_stats"] == [
        {
            "batch_size": 2,
            "compute_input": {"count": 1, "ns": 100_000},
            "compute_infer": {"count": 1, "ns": 4_000_000},
            "compute_output": {"count": 1, "ns": 200_000},
        }
    ]
