"""The collector of unloaded thread instances: one full collection for the unloads of a
moment, run at once before a load, never beside a freeze."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest

from fnrt.runtime.collector import Collector, collect_frozen


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def _counting() -> tuple[list[float], Collector]:
    runs: list[float] = []
    return runs, Collector(delay_s=0.2, collect=lambda: runs.append(time.monotonic()))


def test_the_unloads_of_a_moment_share_one_collection() -> None:
    runs, collector = _counting()
    started = time.monotonic()
    for _ in range(5):
        collector.unloaded()
    assert collector.pending and runs == []
    deadline = time.monotonic() + 5
    while not runs and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # no second one comes
    assert len(runs) == 1 and runs[0] - started >= 0.2 and not collector.pending
    collector.unloaded()  # a later unload gets its own
    collector.settle()
    assert len(runs) == 2


def test_settling_runs_the_pending_collection_now_and_only_then() -> None:
    runs, collector = _counting()
    collector.settle()
    assert runs == []  # nothing pending: nothing to run
    collector.unloaded()
    collector.settle()
    assert len(runs) == 1 and not collector.pending
    time.sleep(0.3)
    assert len(runs) == 1  # its timer, cancelled, runs none


def test_a_freeze_waits_for_a_collection_under_way() -> None:
    """Frozen between a collection's unfreeze and its collect, what it is to free would be
    frozen again: a freeze (a load just made) waits for it."""
    inside, release = threading.Event(), threading.Event()

    def collect() -> None:
        inside.set()
        release.wait(5)

    collector = Collector(delay_s=0.0, collect=collect)
    collector.unloaded()
    assert inside.wait(5)
    froze = threading.Event()
    freezing = threading.Thread(target=lambda: (collector.freeze(), froze.set()))
    freezing.start()
    assert not froze.wait(0.2)
    release.set()
    assert froze.wait(5)
    freezing.join()
    gc.unfreeze()


def test_collect_frozen_frees_a_frozen_cycle() -> None:
    cycle = _Cycle()
    gone = weakref.ref(cycle)
    gc.freeze()
    del cycle
    gc.collect()
    assert gone() is not None  # frozen: out of the collector's reach
    collect_frozen()
    assert gone() is None
    gc.unfreeze()


def test_a_collection_under_way_is_pending_and_settling_waits_for_it() -> None:
    """A load that comes while the timer's collection runs waits for it to end: what was
    unloaded is freed before the next model loads."""
    inside, release = threading.Event(), threading.Event()
    ended: list[str] = []

    def collect() -> None:
        inside.set()
        release.wait(5)
        ended.append("collected")

    collector = Collector(delay_s=0.0, collect=collect)
    collector.unloaded()
    assert inside.wait(5)
    assert collector.pending  # running: a load must still wait
    settling = threading.Thread(target=lambda: (collector.settle(), ended.append("settled")))
    settling.start()
    time.sleep(0.1)
    assert ended == []
    release.set()
    settling.join(5)
    assert ended == ["collected", "settled"] and not collector.pending


def test_a_failed_collection_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    """Settled by a load, a collection's failure (a device's error) is not that load's."""

    def collect() -> None:
        raise RuntimeError("CUDA error: an illegal memory access")

    collector = Collector(delay_s=60.0, collect=collect)
    collector.unloaded()
    collector.settle()
    assert "illegal memory access" in caplog.text and not collector.pending
