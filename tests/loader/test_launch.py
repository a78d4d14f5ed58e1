"""What a worker process's instance counts of the worker's own memory: steady from one
start to the next, so that the memory budget's choices do not follow a MiB of noise."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from fnrt.loader.launch import FIGURES_KEPT, MIB, steady_bytes, worker_bytes_of


def test_a_measure_within_an_eighth_of_a_known_figure_counts_that_figure() -> None:
    assert steady_bytes([], 31 * MIB) == 31 * MIB  # nothing known yet
    assert steady_bytes([31 * MIB], 32 * MIB) == 31 * MIB  # a MiB of noise
    assert steady_bytes([32 * MIB], 28 * MIB) == 32 * MIB  # an eighth: still noise
    assert steady_bytes([32 * MIB], 27 * MIB) == 27 * MIB  # more: a worker of its own
    assert steady_bytes([31 * MIB, 150 * MIB], 148 * MIB) == 150 * MIB  # a torch worker


def test_workers_that_hold_alike_count_alike_and_a_torch_worker_its_own() -> None:
    loader = SimpleNamespace(worker_sizes=[], worker_bytes=0)
    assert worker_bytes_of(loader, 31 * MIB - 5) == 31 * MIB  # to the MiB, rounded up
    assert worker_bytes_of(loader, 31 * MIB + 5) == 31 * MIB  # the next: the same
    assert worker_bytes_of(loader, 150 * MIB) == 150 * MIB  # a spare that imports torch
    assert loader.worker_bytes == 150 * MIB  # what a version never loaded expects
    assert worker_bytes_of(loader, 30 * MIB) == 31 * MIB
    assert worker_bytes_of(loader, 0) == 0  # not measured
    assert loader.worker_sizes == [31 * MIB, 150 * MIB]


def test_the_figures_kept_are_bounded_oldest_first() -> None:
    loader: Any = SimpleNamespace(worker_sizes=[], worker_bytes=0)
    sizes = [int(10 * MIB * 1.2**i) for i in range(FIGURES_KEPT + 5)]  # each its own
    for size in sizes:
        worker_bytes_of(loader, size)
    assert len(loader.worker_sizes) == FIGURES_KEPT
    assert loader.worker_sizes[-1] == -(-sizes[-1] // MIB) * MIB
