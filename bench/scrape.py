"""What a ``/metrics`` scrape costs the event loop, as a node serves more functions.

    python bench/scrape.py [--functions 100,1000,10000] [--called-percent 1] [--rounds 5]

A node keeps about a hundred lines of series for each function it has served
(four histograms, its counters, its state gauges), and Prometheus scrapes them
every 15 s or so, on the event loop. This builds ``--functions`` real
schedulers (as ``fnrt serve`` builds them, ``bench/budget.py``'s echo handler in
a thread, 20 loaded), fills each function's series as a call and a cold start
would, then times in the same run:

- **prometheus_client's writer** (what fnrt used before, and what a user writes
  with the library): each series as a metric family, written by
  ``generate_latest``, the state gauges read from every scheduler;
- **fnrt's** (``tracing/exposition.py``): each label set's lines kept while its
  values are unchanged, the instances of the schedulers holding one read, the
  body sent a family at a time.

Each is timed at the first scrape (every line written), then again after
``--called-percent`` of the functions were called (the usual 15 s of a large
node), with the body made whole. Last, fnrt's longest time on the loop between
two families of the streamed body (what a request arriving during a scrape can
wait). Median milliseconds, and the first writer's over fnrt's. Wall-clock on
the calling thread; the machine's noise moves them, not their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from budget import served
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from fnrt.runtime.node import function_states, instance_devices
from fnrt.tracing.metrics import LoopCounter, LoopHistogram, Metrics


class Families:
    """fnrt's series as prometheus_client metric families (the writer before)."""

    def __init__(self, metrics: Metrics, schedulers: list[Any]) -> None:
        self._metrics = metrics
        self._schedulers = schedulers

    def collect(self) -> Iterator[Metric]:
        for series in self._metrics._per_function:
            yield family(series)
        gauges = [
            GaugeMetricFamily(name, doc, labels=["function", "version"])
            for name, doc in (
                ("fnrt_warm_instances", "Loaded instances"),
                ("fnrt_queue_depth", "Requests waiting in the queue"),
                ("fnrt_running_batches", "Batches running now"),
            )
        ]
        for s in self._schedulers:  # every scheduler's state, as the node read it
            labels = [s.name, s.version.version]
            for gauge, value in zip(
                gauges, (s.pool.instances, s.batcher.queued, s.pool.running), strict=True
            ):
                gauge.add_metric(labels, value)
        yield from gauges


def family(series: LoopCounter | LoopHistogram) -> Metric:
    if isinstance(series, LoopCounter):
        counter = CounterMetricFamily(series.name, series.documentation, labels=series.labels)
        for labels, value in sorted(series.values.items()):
            counter.add_metric(list(labels), value)
        return counter
    histogram = HistogramMetricFamily(series.name, series.documentation, labels=series.labels)
    for labels, child in sorted(series.series.items()):
        cumulative, buckets = 0.0, []
        for bound, count in zip((*series.bounds, float("inf")), child[:-1], strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
        histogram.add_metric(list(labels), buckets, child[-1])
    return histogram


def traffic(metrics: Metrics, names: list[str], *, cold: bool) -> None:
    """A call to each of ``names`` (with its cold start, ``cold``), as the node counts one."""
    for name in names:
        metrics.request(name, "1", 200, 0.003)
        metrics.start(name, "cold" if cold else "warm")
        metrics.batch(name, 1, 0.001, [0.0005])
        if cold:
            metrics.load(name, "l2", 1 << 20, 0.02)


def timed_ms(scrape: Callable[[], Any]) -> float:
    started = time.perf_counter()
    scrape()
    return (time.perf_counter() - started) * 1e3


def longest_family_ms(metrics: Metrics) -> float:
    """The longest a streamed scrape holds the loop: making one family."""
    longest, families = 0.0, metrics.families()
    while True:
        started = time.perf_counter()
        if next(families, None) is None:
            return longest
        longest = max(longest, (time.perf_counter() - started) * 1e3)


async def measure(functions: int, called: float, rounds: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        schedulers, holders = await served(Path(folder), functions, 20)
        names = [s.name for s in schedulers]
        step = max(1, round(100 / called)) if called else 0
        for _ in range(rounds):
            ours = Metrics(gpu=False)
            ours.watch(lambda: function_states(schedulers, holders()))
            ours.watch_devices(lambda: instance_devices(holders()))
            theirs = CollectorRegistry()
            theirs.register(Families(ours, schedulers))
            traffic(ours, names, cold=True)
            for way, scrape in (
                ("before", lambda registry=theirs: generate_latest(registry)),
                ("fnrt", ours.exposition),
            ):
                out.setdefault(f"first {way}", []).append(timed_ms(scrape))
                if step:
                    traffic(ours, names[::step], cold=False)
                out.setdefault(f"again {way}", []).append(timed_ms(scrape))
            traffic(ours, names[::step] if step else [], cold=False)
            out.setdefault("family fnrt", []).append(longest_family_ms(ours))
            out.setdefault("MB", []).append(len(ours.exposition()) / 1e6)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", default="100,1000,10000")
    parser.add_argument("--called-percent", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(
        f"\nms a scrape, median of {args.rounds}; again: after {args.called_percent:g}% "
        "of the functions were called\n"
    )
    print(
        f"{'functions':>9} {'MB':>5} {'scrape':>7} {'prometheus_client':>18} {'fnrt':>8} "
        f"{'ratio':>7}   longest family (fnrt, streamed)"
    )
    for functions in (int(n) for n in args.functions.split(",")):
        found = asyncio.run(measure(functions, args.called_percent, args.rounds))
        med = {key: statistics.median(values) for key, values in found.items()}
        for scrape in ("first", "again"):
            before, ours = med[f"{scrape} before"], med[f"{scrape} fnrt"]
            tail = f"   {med['family fnrt']:.2f} ms" if scrape == "again" else ""
            print(
                f"{functions:>9} {med['MB']:>5.1f} {scrape:>7} {before:>18.1f} {ours:>8.1f} "
                f"{before / ours:>6.1f}x{tail}"
            )


if __name__ == "__main__":
    main()
