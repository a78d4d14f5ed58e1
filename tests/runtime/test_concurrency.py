"""Choosing per-GPU concurrency by measurement: the decision, the levels, a real sweep."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from fnrt.functions.manifest import TensorSpec
from fnrt.runtime.concurrency import (
    LevelResult,
    SweepConfig,
    at_level,
    best_level,
    sample_request,
    sweep,
)
from support import make_node, publish, write_function


def _level(level: int, rps: float, p99_ms: float = 10.0, errors: int = 0) -> LevelResult:
    return LevelResult(level, int(rps * 2), errors, 2.0, p99_ms / 2, p99_ms)


def test_the_best_level_is_the_fastest_and_the_smallest_of_near_ties() -> None:
    results = [_level(1, 1000), _level(2, 1700), _level(4, 1720), _level(8, 1500)]
    best = best_level(results)
    assert best is not None and best.level == 2  # 4 is within 2% of it: 2 holds less memory
    assert best_level(results, within=0.0).level == 4  # type: ignore[union-attr]


def test_levels_with_errors_or_over_the_p99_limit_are_passed_over() -> None:
    results = [_level(1, 1000, 5.0), _level(2, 1800, 40.0), _level(4, 2500, 9.0, errors=3)]
    assert best_level(results).level == 2  # type: ignore[union-attr]
    assert best_level(results, p99_limit_ms=20.0).level == 1  # type: ignore[union-attr]
    assert best_level(results, p99_limit_ms=1.0) is None
    assert best_level([]) is None


def test_a_level_is_exactly_that_many_instances(tmp_path: Path) -> None:
    from support import packed

    vm, _ = packed(write_function(tmp_path, "f"))
    four = at_level(vm, 4)
    assert (four.manifest.scaling.min_instances, four.manifest.scaling.max_instances) == (4, 4)
    assert four.manifest.batching == vm.manifest.batching


def test_a_sample_request_fills_rows_and_keeps_declared_dtypes(tmp_path: Path) -> None:
    from support import packed

    vm, _ = packed(write_function(tmp_path, "f"))
    request = sample_request(vm.manifest, rows=3)
    assert request["x"].shape == (3, 4) and request["x"].dtype == np.float32
    assert TensorSpec("float32", (-1, 4)).matches_shape(request["x"].shape)


def test_bad_sweep_configs_are_refused() -> None:
    for bad in ({"levels": ()}, {"levels": (0,)}, {"clients": 0}, {"duration_s": 0}):
        with pytest.raises(ValueError):
            SweepConfig(**bad)  # type: ignore[arg-type]


def test_a_sweep_serves_each_level_through_the_batcher(tmp_path: Path) -> None:
    node = make_node(tmp_path, isolation="thread")
    folder = write_function(tmp_path / "src", "echo")
    seen: list[int] = []

    async def run() -> list[LevelResult]:
        vm = publish(node.repository, folder)
        config = SweepConfig(levels=(1, 2), clients=8, warmup_s=0.1, duration_s=0.3)
        return await sweep(
            node.registry.schedulers,
            vm,
            sample_request(vm.manifest),
            config,
            lambda r: seen.append(r.level),
        )

    results = asyncio.run(run())
    assert [r.level for r in results] == seen == [1, 2]
    for r in results:
        assert r.requests > 0 and r.errors == 0 and r.p99_ms >= r.p50_ms > 0
        assert r.to_dict()["throughput_rps"] == round(r.throughput_rps, 1)
