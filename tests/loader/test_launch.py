"""What a worker process's instance counts of the worker's own memory: steady from one
start to the next, so that the memory budget's choices do not follow a MiB of noise."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

from fnrt.loader.launch import FIGURES_KEPT, MIB, steady_bytes, worker_bytes_of


def _loader() -> Any:
    return SimpleNamespace(worker_sizes=[], worker_bytes=0, worker_sizes_lock=threading.Lock())


def test_a_measure_within_an_eighth_of_a_known_figure_counts_the_nearest() -> None:
    assert steady_bytes([], 31 * MIB) == 31 * MIB  # nothing known yet
    assert steady_bytes([31 * MIB], 32 * MIB) == 31 * MIB  # a MiB of noise
    assert steady_bytes([32 * MIB], 28 * MIB) == 32 * MIB  # an eighth of it: still noise
    assert steady_bytes([32 * MIB], 27 * MIB) == 27 * MIB  # more: a worker of its own
    assert steady_bytes([100 * MIB, 113 * MIB], 112 * MIB) == 113 * MIB  # the nearest
    assert steady_bytes([31 * MIB, 150 * MIB], 148 * MIB) == 150 * MIB  # a torch worker


def test_workers_that_hold_alike_count_alike_and_a_torch_worker_its_own() -> None:
    loader = _loader()
    assert worker_bytes_of(loader, 31 * MIB - 5) == 31 * MIB  # to the MiB, rounded up
    assert worker_bytes_of(loader, 31 * MIB + 5) == 31 * MIB  # the next: the same
    assert worker_bytes_of(loader, 150 * MIB) == 150 * MIB  # a spare that imports torch
    assert worker_bytes_of(loader, 30 * MIB) == 31 * MIB
    assert loader.worker_bytes == 150 * MIB  # a version never loaded: the largest
    assert worker_bytes_of(loader, 0) == 0  # not measured
    assert loader.worker_sizes == [150 * MIB, 31 * MIB]  # the last used last


def test_the_figures_kept_are_bounded_the_least_recently_used_first() -> None:
    loader = _loader()
    sizes = [int(10 * MIB * 1.2**i) for i in range(FIGURES_KEPT)]  # each its own figure
    for size in sizes:
        worker_bytes_of(loader, size)
    worker_bytes_of(loader, sizes[0])  # the first, used again
    larger = sizes[-1] // MIB * 2 * MIB
    worker_bytes_of(loader, larger)  # one more: the second goes
    kept = loader.worker_sizes
    assert len(kept) == FIGURES_KEPT and kept[-1] == larger
    assert -(-sizes[0] // MIB) * MIB in kept and -(-sizes[1] // MIB) * MIB not in kept


def test_workers_loading_side_by_side_share_one_figure() -> None:
    loader = _loader()
    measures = [31 * MIB + i * 1024 for i in range(200)] + [32 * MIB] * 200
    with ThreadPoolExecutor(8) as pool:
        counted = set(pool.map(lambda m: worker_bytes_of(loader, m), measures))
    assert len(counted) == 1 and len(loader.worker_sizes) == 1
